"""``bench.sim_record``: a ``genpool sim`` run whose JSON records the commit, the command
and whether the tree was clean (docs/results.md, "How the figures stay true"); a usage
error or a failed run writes nothing of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import sim_record
from genpool_devcluster.checkout import COMMIT_ENV
from tests.unit.support import write_small_trace


def test_the_sims_json_gets_its_commit_and_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(COMMIT_ENV, "f" * 40)
    out = tmp_path / "run.json"
    trace = write_small_trace(tmp_path / "t.csv")
    argv = ["sim", "--trace", str(trace), "--concurrency", "8", "--workers", "2", "--max-batch",
            "4", "--duration", "20", "--warmup", "2", "--seeds", "1", "--jobs", "1",
            "--json", str(out)]  # fmt: skip
    assert sim_record.main(argv) == 0
    document = json.loads(out.read_text())
    assert document["commit"] == "f" * 40 and document["dirty"] is False
    assert document["command"] == "python -m bench.sim_record " + " ".join(argv)
    assert document["runs"] and document["args"]["command"] == "sim"  # the sim's own output


@pytest.mark.parametrize("argv", [[], ["sim", "--seeds", "1"], ["worker", "--json", "x.json"]])
def test_a_run_without_sim_or_json_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert sim_record.main(argv) == 2
    assert "usage: python -m bench.sim_record sim" in capsys.readouterr().err


def test_a_failed_sim_run_leaves_no_json(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    assert sim_record.main(["sim", "--trace", str(tmp_path / "nope.csv"), "--json", str(out)]) == 2
    assert not out.exists()
