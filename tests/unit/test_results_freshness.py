"""The results page stays true to the code (bench/freshness.py, docs/results.md "How the
figures stay true"): this checkout's page and JSONs, and the rule itself on a scratch
repository (a figure without its JSON, a stale or unversioned JSON not marked, a mark
that outlives its reason)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench import freshness


def test_every_figure_on_the_results_page_cites_a_fresh_or_marked_json() -> None:
    assert freshness.problems() == []


def _git(repo: Path, *args: str) -> str:
    found = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return found.stdout.strip()


class Scratch:
    """A repository with one measured module, one result and the two pages."""

    def __init__(self, root: Path) -> None:
        self.root = root
        _git(root, "init", "-q")
        _git(root, "config", "user.email", "t@example.invalid")
        _git(root, "config", "user.name", "t")
        (root / "bench" / "results").mkdir(parents=True)
        (root / "docs").mkdir()
        self.write("core.py", "SPEED = 1\n")
        self.write("README.md", "# Scratch\n")
        self.page("Runs at 12.5 us (bench/results/x.json).")
        self.commit()
        self.record()

    def write(self, path: str, text: str) -> None:
        (self.root / path).write_text(text)

    def page(self, body: str) -> None:
        self.write("docs/results.md", f"# Results\n\n## The pass\n\n{body}\n")

    def commit(self) -> str:
        _git(self.root, "add", "-A")
        _git(self.root, "commit", "-qm", "step", "--allow-empty")
        return _git(self.root, "rev-parse", "HEAD")

    def record(self, **fields: object) -> None:
        """Run the 'bench': a result recording the current commit."""
        document = {"commit": _git(self.root, "rev-parse", "HEAD"), "command": "bench x",
                    "dirty": False} | fields  # fmt: skip
        self.write("bench/results/x.json", json.dumps(document))
        self.commit()


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Scratch:
    monkeypatch.setattr(freshness, "MEASURED", {"x.json": ("core.py",)})
    monkeypatch.setattr(freshness, "UNVERSIONED", {})
    monkeypatch.setattr(freshness, "STALE", {})
    return Scratch(tmp_path)


def test_a_fresh_cited_result_passes(scratch: Scratch) -> None:
    assert freshness.problems(scratch.root) == []


def test_a_change_to_measured_code_stales_the_result_until_rerun_or_marked(
    scratch: Scratch, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch.write("core.py", "SPEED = 2\n")
    scratch.commit()
    problem, unmarked = freshness.problems(scratch.root)
    assert "x.json is stale: core.py changed" in problem and "rerun `bench x`" in problem
    assert "cites stale bench/results/x.json without saying so" in unmarked
    monkeypatch.setattr(freshness, "STALE", {"x.json": "rerun pending"})
    (problem,) = freshness.problems(scratch.root)
    assert "cites stale bench/results/x.json without saying so" in problem
    scratch.page("Runs at 12.5 us (bench/results/x.json; stale: before core.py changed).")
    scratch.commit()
    assert freshness.problems(scratch.root) == []
    scratch.record()  # rerun: fresh, so the mark has to go
    assert any("fresh again" in p for p in freshness.problems(scratch.root))


def test_an_edit_to_comments_or_docstrings_leaves_the_result_fresh(scratch: Scratch) -> None:
    scratch.write("core.py", '"""The speed."""\n\nSPEED = 1  # measured\n')
    scratch.commit()
    assert freshness.problems(scratch.root) == []
    scratch.write("core.py", '"""The speed."""\n\nSPEED = 1.0  # measured\n')
    scratch.commit()
    assert "x.json is stale: core.py changed" in freshness.problems(scratch.root)[0]


def test_a_change_elsewhere_leaves_the_result_fresh(scratch: Scratch) -> None:
    scratch.write("other.py", "UNMEASURED = 1\n")
    scratch.commit()
    assert freshness.problems(scratch.root) == []


def test_a_figure_without_its_json_or_with_a_missing_one_fails(scratch: Scratch) -> None:
    scratch.page("Runs at 12.5 us.")
    assert any("figure(s) but no JSON cited" in p for p in freshness.problems(scratch.root))
    scratch.page("Runs at 12.5 us (bench/results/gone.json).")
    found = freshness.problems(scratch.root)
    assert any("bench/results/gone.json does not exist" in p for p in found)


def test_a_figure_under_a_cited_section_is_covered(scratch: Scratch) -> None:
    scratch.write("docs/results.md",
                  "# Results\n\n## The pass (bench/results/x.json)\n\nSee below.\n\n"
                  "### At scale\n\n| a | b |\n|---|---|\n| 1 | 12.5 us |\n")  # fmt: skip
    assert freshness.problems(scratch.root) == []


def test_a_result_must_say_what_produced_it(
    scratch: Scratch, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch.write("bench/results/x.json", json.dumps({"speed": 1}))
    assert any("records no commit" in p for p in freshness.problems(scratch.root))
    scratch.record(dirty=True)
    assert any("dirty tree" in p for p in freshness.problems(scratch.root))
    scratch.write("bench/results/x.json", json.dumps({"speed": 1}))
    monkeypatch.setattr(freshness, "UNVERSIONED", {"x.json": "measured in 2026-11"})
    assert any("unversioned" in p for p in freshness.problems(scratch.root))
    scratch.page("Runs at 12.5 us (bench/results/x.json, unversioned: from 2026-11).")
    assert freshness.problems(scratch.root) == []
    scratch.record()  # rerun: versioned now, so it is judged like the rest
    assert any("move it from UNVERSIONED" in p for p in freshness.problems(scratch.root))


def test_a_new_result_must_say_what_it_measures(scratch: Scratch) -> None:
    scratch.write("bench/results/y.json", "{}")
    assert any("y.json: say what it measures" in p for p in freshness.problems(scratch.root))


def test_a_result_measures_the_core_modules_its_code_imports_and_no_others() -> None:
    sim = set(freshness.SIM)
    scheduler = set(freshness.MEASURED["scheduler.json"])
    # What the simulator runs: the shipped policies, reached through the scheduler.
    for module in ("scheduler.py", "kv_blocks.py", "preemption/pausing.py", "scaler.py"):
        assert f"core/genpool_core/{module}" in sim, module
    assert "sim/genpool_sim/__init__.py" in sim
    assert "core/genpool_core/kv_blocks.py" in scheduler
    assert "core/genpool_core/scaler.py" not in scheduler  # no autoscaler in a pass
    # Modules no simulator or scheduler code reaches: an edit there moves no figure.
    for module in ("worker_env.py", "termination.py"):
        assert f"core/genpool_core/{module}" not in sim | scheduler, module
    assert all((freshness.ROOT / path).is_file() for path in sim | scheduler)
