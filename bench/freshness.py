"""Is the results page true to the code? (docs/results.md, "How the figures stay true")

The rule, checked by ``make test`` (tests/unit/test_results_freshness.py) and by
``python -m bench.freshness``:

1. Every figure cites the JSON it comes from: each section of docs/results.md and the
   README with a measured number in it (a number with a unit: ``FIGURE``) names a
   ``bench/results/...json``, or sits under a section that does; and every JSON a
   page names exists.
2. Every JSON says what produced it: its ``commit`` (in this branch's history) and its
   ``command``, from a clean tree (``dirty`` false). Results measured before JSONs
   recorded that are listed in ``UNVERSIONED`` (``bench/freshness_marks.py``, with
   ``STALE``) with when and how, and every section citing one says "unversioned".
3. A JSON is stale when a file it measures (``MEASURED``: the bench's own code and the
   product modules whose behaviour its figures report; for the scheduler bench and the
   simulator studies, the core modules their code imports, from the import graph)
   changed after its commit (its
   code: a Python file's syntax tree, so comments and docstrings do not count). A
   stale JSON stays on the page only listed in ``STALE`` with the reason, and every
   section citing it says "stale"; a listed one that is fresh again (rerun) fails
   until its mark goes, so no mark outlives its reason.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.freshness_marks import STALE, UNVERSIONED

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "bench/results"
PAGES = ("docs/results.md", "README.md")  # where every table must cite its JSON
CITATION = re.compile(r"bench/results/[\w./-]+\.json")
HEADING = re.compile(r"^(#{1,6}) ")
# A figure: a measured number, with a unit or a decimal point (not "R1", not a step "7.1"
# of a list: those have no unit and are not in a table's measured columns).
FIGURE = re.compile(r"\b\d+(?:\.\d+)?\s?(?:%|x\b|µs|us\b|ms\b|s\b|tok|GiB|GB|MiB|TB/s)")

KV_POOL = ("core/genpool_core/kv_account.py", "core/genpool_core/kv_blocks.py",
           "core/genpool_core/kv_index.py", "core/genpool_core/kv_lru.py",
           "core/genpool_core/block_hash.py")  # fmt: skip
PREEMPTION_COST = ("bench/preemption_cost.py", "core/genpool_core/preemption",
                   "core/genpool_core/scheduler.py", "core/genpool_core/scheduler_phases.py",
                   "worker/genpool_worker/engine.py",
                   "devcluster/genpool_devcluster/loadgen.py")  # fmt: skip
SERVING = ("bench/serving_load.py", "bench/pd_report.py")
# The network's passes over the KV cache, as the model benches time them (greedy by
# argmax: the sampler is not in them).
FORWARD_PASSES = ("worker/genpool_worker/model", ":(exclude)worker/genpool_worker/model/sampler.py",
                  ":(exclude)worker/genpool_worker/model/tokenizer.py",
                  "bench/decode_support.py")  # fmt: skip


def imported_sources(module: str) -> tuple[str, ...]:
    """``module`` (a package: all of it) and every core module it imports, directly or
    not, as files: what a result of it can depend on. A core module it never reaches
    (the worker pod's environment names, the termination log) cannot move its figures,
    so an edit there leaves the result fresh."""
    graph = _import_graph()
    names = {module, *graph.find_upstream_modules(module, as_package=True)}
    is_package = (ROOT / _layer(module) / module.replace(".", "/") / "__init__.py").is_file()
    if is_package:
        names |= graph.find_descendants(module)
    paths = {"core/genpool_core/__init__.py"}
    for name in names:
        relative = f"{_layer(name)}/{name.replace('.', '/')}"
        is_package = (ROOT / relative / "__init__.py").is_file()
        paths.add(f"{relative}/__init__.py" if is_package else f"{relative}.py")
    return tuple(sorted(paths))


@functools.cache
def _import_graph() -> Any:
    import grimp  # import-linter's graph: only this check needs it

    return grimp.build_graph("genpool_sim", "genpool_core")


def _layer(module: str) -> str:
    return "sim" if module.startswith("genpool_sim") else "core"


SIM = imported_sources("genpool_sim")  # the simulator runs the shipped policies
SIM_STUDY = (*SIM, "bench/sim_record.py")  # a `genpool sim` run that records its provenance
INTEROP = ("worker/genpool_worker/kv_events.py", "worker/genpool_worker/kv_events_wire.py",
           "worker/genpool_worker/kv_events_config.py", "bench/kv_events_interop.py",
           "bench/kv_events_epp.py", "devcluster/genpool_devcluster/interop")  # fmt: skip
DEMO = ("devcluster/genpool_devcluster/demo.py", "devcluster/genpool_devcluster/demo_load.py",
        "devcluster/genpool_devcluster/demo_pools.py", "core/genpool_core/scaler.py",
        "core/genpool_core/scaler_estimates.py", "core/genpool_core/scaler_signals.py")  # fmt: skip

# JSON (under bench/results) -> what its figures measure.
MEASURED: dict[str, tuple[str, ...]] = {
    "scheduler.json": (
        *imported_sources("genpool_core.scheduler"),
        "bench/scheduler.py",
        "bench/scheduler_runner.py",
        "bench/scheduler_report.py",
    ),
    "decode_check.json": ("worker/genpool_worker/model/checks.py", "bench/decode_check.py"),
    "chunked_prefill.json": (
        "core/genpool_core/prefill_budget.py",
        "bench/chunked_prefill.py",
        "worker/genpool_worker/model_runner.py",
        *SERVING,
    ),
    "pd.json": (
        "worker/genpool_worker/pd",
        "worker/genpool_worker/kv_connector.py",
        "bench/pd.py",
        *SERVING,
    ),
    "prefix_chat.json": (*KV_POOL, "bench/prefix_chat.py", "bench/prefix_report.py", *SERVING),
    "speculative.json": (
        "core/genpool_core/speculation.py",
        "worker/genpool_worker/speculative.py",
        "worker/genpool_worker/spec_verify.py",
        "worker/genpool_worker/run_state.py",
        "worker/genpool_worker/model_runner.py",
        *FORWARD_PASSES,
        "bench/speculative.py",
        *SERVING,
    ),
    "guidellm.json": (
        "bench/guidellm_bench.py",
        "worker/genpool_worker/chat_route.py",
        "worker/genpool_worker/completions_route.py",
        "core/genpool_core/preemption",
    ),
    "guidellm_pool.json": (
        "bench/guidellm_pool.py",
        "bench/guidellm_bench.py",
        "worker/genpool_worker/chat_route.py",
        "worker/genpool_worker/completions_route.py",
        "core/genpool_core/preemption",
        "core/genpool_core/tuner.py",  # the operator tunes the pausing pool's knobs live
    ),
    "kv_events_interop.json": INTEROP,
    "kv_events_interop_smollm2.json": INTEROP,
    "kv_events_interop_cluster.json": INTEROP,
    "kv_events_interop_cluster_smollm2.json": INTEROP,
    "demo_live_seed0.json": DEMO,
    "demo_live_seed1.json": DEMO,
    "demo_live_seed2.json": DEMO,
    "sim/prefix.json": (*SIM, "bench/sim_prefix.py"),
    "sim/demo_load.json": (*SIM, *DEMO, "bench/sim_demo_load.py"),
    "sim/demo_load_slo0.3.json": (*SIM, *DEMO, "bench/sim_demo_load.py"),
    "sim/autoscale_law.json": (*SIM, "bench/autoscale_study.py", "bench/autoscale_cases.py"),
    "sim.json": (*SIM, "bench/sim.py"),
    "sim/r1.json": SIM_STUDY,
    "sim/cap_curve.json": SIM_STUDY,
    "sim/open_loop_rate15.json": SIM_STUDY,
    "sim/classes.json": SIM_STUDY,
    "sim/classes_floors_only.json": SIM_STUDY,
    "sim/tune.json": (*SIM, "bench/sim_tune.py"),
    "sim/kv_headroom.json": (*SIM, "bench/sim_kv.py"),
    "worker.json": (*FORWARD_PASSES, "worker/genpool_worker/model_runner.py", "bench/worker.py"),
    "operator.json": (
        "operator/genpool_operator/scrape.py",
        "operator/genpool_operator/statsloop.py",
        "bench/operator.py",
    ),
    "kv_residents.json": (*KV_POOL, "core/genpool_core/scheduler.py", "bench/kv_residents.py"),
    "detokenize.json": (
        "worker/genpool_worker/detokenizer.py",
        "worker/genpool_worker/output_processor.py",
        "bench/detokenize.py",
        "bench/versus.py",
    ),
    "penalties.json": (
        "worker/genpool_worker/model/sampler.py",
        "bench/penalties.py",
        "bench/versus.py",
    ),
    "cpu_decode.json": (
        *FORWARD_PASSES,
        "worker/genpool_worker/model_runner.py",
        "bench/cpu_decode.py",
    ),
    "preemption_cost.json": PREEMPTION_COST,
    "preemption_cost_synthetic.json": PREEMPTION_COST,
    "batched_prefill.json": (*FORWARD_PASSES, "bench/batched_prefill.py"),
    "fuzz.json": ("worker/genpool_worker", "bench/fuzz.py", "bench/fuzz_cases.py"),
    "faults.json": (
        "worker/genpool_worker",
        "bench/faults.py",
        "bench/fault_load.py",
        "bench/fault_pool.py",
    ),
}


def provenance_of(document: Any) -> dict[str, Any]:
    """The commit/command/dirty a result records (top level, or under ``meta``)."""
    if not isinstance(document, dict):
        return {}
    meta = document.get("meta")
    return meta if isinstance(meta, dict) and "commit" in meta else document


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)


def changed_since(root: Path, commit: str, paths: tuple[str, ...]) -> list[str] | None:
    """Files under ``paths`` whose code differs between ``commit`` and HEAD; None when
    ``commit`` is not in HEAD's history."""
    if _git(root, "merge-base", "--is-ancestor", commit, "HEAD").returncode != 0:
        return None
    found = _git(root, "diff", "--name-only", commit, "HEAD", "--", *paths)
    changed = [line for line in found.stdout.splitlines() if line]
    return [path for path in changed if _is_code_change(root, commit, path)]


def _is_code_change(root: Path, commit: str, path: str) -> bool:
    """False for a Python file whose syntax tree, docstrings left out, is the same at
    ``commit`` and HEAD: only its comments or docs were edited, so its figures hold."""
    if not path.endswith(".py"):
        return True
    old, new = (_git(root, "show", f"{rev}:{path}") for rev in (commit, "HEAD"))
    if old.returncode or new.returncode:  # added or deleted
        return True
    try:
        return _code(old.stdout) != _code(new.stdout)
    except SyntaxError:
        return True


def _code(source: str) -> str:
    """``source``'s syntax tree without docstrings (and, as ``ast`` does, comments)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
                    isinstance(first.value.value, str):  # fmt: skip
                node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree)


def result_problems(root: Path) -> tuple[list[str], set[str]]:
    """Problems with the JSONs themselves, and which are stale."""
    problems: list[str] = []
    stale: set[str] = set()
    on_disk = {p.relative_to(root / RESULTS).as_posix() for p in (root / RESULTS).rglob("*.json")}
    for name in sorted(set(MEASURED) | set(UNVERSIONED) | set(STALE)):
        if name not in on_disk:
            problems.append(f"{RESULTS}/{name} is listed in bench/freshness.py but missing")
    for name in sorted(on_disk):
        if name not in MEASURED and name not in UNVERSIONED:
            problems.append(f"{RESULTS}/{name}: say what it measures (bench/freshness.py)")
            continue
        try:
            document = json.loads((root / RESULTS / name).read_text())
        except (OSError, ValueError) as error:
            problems.append(f"{RESULTS}/{name}: not readable JSON ({error})")
            continue
        source = provenance_of(document)
        if name in UNVERSIONED:
            if source.get("commit"):  # rerun since: judge it like any other
                problems.append(f"{RESULTS}/{name} records its commit now: move it from "
                                f"UNVERSIONED to MEASURED")  # fmt: skip
            continue
        problems += _versioned_problems(root, name, source, stale)
    return problems, stale


def _versioned_problems(root: Path, name: str, source: dict[str, Any],
                        stale: set[str]) -> list[str]:  # fmt: skip
    commit, command = source.get("commit"), source.get("command")
    where = f"{RESULTS}/{name}"
    if not isinstance(commit, str) or not re.fullmatch(r"[0-9a-f]{40}", commit):
        return [f"{where}: records no commit (rerun it, or list it in UNVERSIONED)"]
    if not isinstance(command, str) or not command:
        return [f"{where}: records no command"]
    if source.get("dirty") is True:
        return [f"{where}: measured on a dirty tree (commit first, then rerun `{command}`)"]
    changed = changed_since(root, commit, MEASURED[name])
    if changed is None:
        return [f"{where}: its commit {commit[:8]} is not in this branch's history"]
    if changed:
        stale.add(name)
        if name not in STALE:
            shown = ", ".join(changed[:4]) + (" ..." if len(changed) > 4 else "")
            return [f"{where} is stale: {shown} changed since {commit[:8]}; rerun `{command}`, "
                    f"or list it in STALE with the reason and mark its sections"]  # fmt: skip
    elif name in STALE:
        return [f"{where} is fresh again: drop its STALE mark (and the docs' 'stale')"]
    return []


@dataclass
class Section:
    heading: str
    depth: int
    text: list[str]
    cited: set[str]
    num_figures: int = 0


def sections(page: str) -> list[tuple[Section, set[str]]]:
    """Each section of a markdown page with the citations it inherits from the sections
    above it (a table under a cited heading is covered)."""
    found: list[tuple[Section, set[str]]] = []
    stack: list[Section] = []
    current = Section("(top)", 0, [], set())
    found_sections = [current]
    for line in page.splitlines():
        heading = HEADING.match(line)
        if heading:
            current = Section(line.strip(), len(heading.group(1)), [], set(CITATION.findall(line)))
            found_sections.append(current)
            continue
        current.text.append(line)
        current.cited.update(CITATION.findall(line))
        if not line.startswith(("    ", "```", "python ", "make ")):  # not a command
            current.num_figures += len(FIGURE.findall(line))
    for section in found_sections:
        while stack and stack[-1].depth >= section.depth > 0:
            stack.pop()
        inherited = set().union(*(above.cited for above in stack)) if stack else set()
        found.append((section, inherited))
        if section.depth > 0:
            stack.append(section)
    return found


def page_problems(root: Path, page_path: str, stale: set[str], unversioned: set[str]) -> list[str]:
    problems: list[str] = []
    page = (root / page_path).read_text()
    for section, inherited in sections(page):
        text = "\n".join(section.text).lower()
        if section.num_figures and not (section.cited | inherited):
            problems.append(f"{page_path} {section.heading!r}: {section.num_figures} figure(s) "
                            f"but no JSON cited")  # fmt: skip
        for cited in sorted(section.cited):
            name = cited.removeprefix(RESULTS + "/")
            if not (root / cited).is_file():
                problems.append(f"{page_path} {section.heading!r}: {cited} does not exist")
            elif name in stale and "stale" not in text:
                problems.append(f"{page_path} {section.heading!r}: cites stale {cited} "
                                f"without saying so")  # fmt: skip
            elif name in unversioned and "unversioned" not in text:
                problems.append(f"{page_path} {section.heading!r}: cites unversioned {cited} "
                                f"without saying so")  # fmt: skip
    return problems


def problems(root: Path = ROOT) -> list[str]:
    """Everything that keeps the results page from being true to the code."""
    found, stale = result_problems(root)
    for page in PAGES:
        found += page_problems(root, page, stale, set(UNVERSIONED))
    return found


def main() -> int:
    found = problems()
    for problem in found:
        print(problem)
    print(f"{len(found)} problem(s)" if found else "results: every figure cites a fresh JSON")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
