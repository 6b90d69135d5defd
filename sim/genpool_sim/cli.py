"""``genpool sim``: the simulator of docs/design.md#simulator (``genpool_cli`` dispatches here).

This module does the I/O (files, processes, progress bar, plots); everything it
calls in ``genpool_sim`` is pure and seeded. The flags are in ``genpool_sim.cli_options``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from genpool_core.knobs import DEFAULT_PAUSED_CAP_FRACTION, KnobBounds
from genpool_core.kv_blocks import reserved_tokens
from genpool_core.tuner import TunerSettings
from genpool_sim.autoscale_cli import AutoscaleUsageError, run_autoscale
from genpool_sim.cli_options import DEFAULT_TRACE, build_parser
from genpool_sim.cluster import ClusterConfig
from genpool_sim.experiment import RunResult, Workload, run_seed
from genpool_sim.pool_control import TuneConfig
from genpool_sim.prefix_cli import (
    PrefixUsageError,
    caching_label,
    check_conversation_budget,
    check_prefix_flags,
    conversation_workload,
)
from genpool_sim.report import class_summary, format_class_table, format_table, summarize
from genpool_sim.workload import (
    RatePhase,
    TraceError,
    TraceRequest,
    parse_csv_trace,
    parse_jsonl_trace,
    parse_rate_phases,
    scale_time,
)

__all__ = [
    "DEFAULT_TRACE",
    "UsageError",
    "build_parser",
    "load_trace",
    "main",
    "report",
    "run_sim",
    "tune_config",
]


class UsageError(Exception):
    """A bad command line: reported as argparse does, exit status 2."""


def tune_config(ns: argparse.Namespace) -> TuneConfig | None:
    if not ns.tune:
        return None
    a = ns.max_batch
    try:
        bounds = KnobBounds(
            ns.headroom_min, _or(ns.headroom_max, a), ns.cap_min, _or(ns.cap_max, a)
        )
        settings = TunerSettings(
            cooldown_intervals=ns.tune_cooldown, guarded=ns.tune_rule == "guarded"
        )
    except ValueError as exc:
        raise UsageError(f"tuner bounds: {exc}") from None
    return TuneConfig(bounds, ns.tune_interval, settings)


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def load_trace(path: Path) -> list[TraceRequest]:
    try:
        with path.open(encoding="utf-8", errors="strict") as handle:
            if path.suffix in (".jsonl", ".json"):
                return parse_jsonl_trace(handle, str(path))
            return parse_csv_trace(handle, str(path))
    except OSError as exc:
        raise UsageError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text ({exc.reason})") from None


def _job(
    args: tuple[ClusterConfig, Workload, list[str], int, float | None, bool, TuneConfig | None],
) -> list[RunResult]:
    config, workload, modes, seed, target, keep, tune = args
    return run_seed(config, workload, modes, seed, target, keep_records=keep, tune=tune)


def run_sim(ns: argparse.Namespace) -> int:
    trace = load_trace(ns.trace)
    rate_phases = _set_duration(ns)
    tune = tune_config(ns)
    if not 0 <= ns.warmup < ns.duration:
        raise UsageError("need 0 <= --warmup < --duration")
    check_prefix_flags(ns)
    scenarios = _scenarios(ns, trace, rate_phases)
    if ns.classes is not None:
        scenarios = [(name, replace(w, classes=ns.classes)) for name, w in scenarios]
    base = _base_config(ns, trace)
    if ns.autoscale:
        if len(scenarios) != 1:
            raise UsageError("--autoscale runs one load: give one --concurrency value")
        name, workload = scenarios[0]
        if ns.paused_cap_fraction is not None:
            raise UsageError("--autoscale pools start their knobs as a GenPool does: drop"
                             " --paused-cap-fraction")  # fmt: skip
        return run_autoscale(ns, name, workload, base, tune)
    results: dict[tuple[str, float], list[RunResult]] = {}
    for is_caching in ns.prefix_caching:  # each a table of its own, on the same seeds
        named = [(caching_label(name, is_caching, ns), w) for name, w in scenarios]
        results |= _run_seeds(ns, named, replace(base, prefix_caching=is_caching), tune)
    return report(ns, results)


def _base_config(ns: argparse.Namespace, trace: list[TraceRequest]) -> ClusterConfig:
    if ns.kv_block_size is not None and ns.kv_blocks is None:
        raise UsageError("--kv-block-size sizes the blocks of --kv-blocks: give both")
    base = ClusterConfig(workers=ns.workers, max_batch=ns.max_batch, ctx_servers=ns.ctx_servers,
                         tpot_budget=ns.tpot_budget, kv_blocks=ns.kv_blocks,
                         kv_transfer_s_per_token=ns.kv_transfer_s_per_token,
                         colocated=ns.colocated, router=ns.router)  # fmt: skip
    if ns.kv_block_size is not None:
        base = replace(base, kv_block_size=ns.kv_block_size)
    if (ns.speculative_tokens is None) != (ns.acceptance_rate is None):
        raise UsageError("--speculative-tokens and --acceptance-rate go together: give both")
    if ns.speculative_tokens is not None:
        base = replace(base, num_speculative_tokens=ns.speculative_tokens,
                       acceptance_rate=ns.acceptance_rate)  # fmt: skip
    if ns.conversations is not None:  # a turn is at most the context, whatever the trace
        check_conversation_budget(base, conversation_workload(ns, trace))
    else:
        check_kv_budget(base, trace)
    return base


def check_kv_budget(config: ClusterConfig, trace: list[TraceRequest]) -> None:
    """Every request the trace can send must fit a worker's KV blocks, or it would wait
    at its queue's head for ever (the core refuses it mid-run; here it is a usage error)."""
    budget = config.kv_budget
    if budget is None:
        return
    longest = max(trace, key=lambda r: reserved_tokens(r.prompt_tokens, r.output_tokens))
    tokens = reserved_tokens(longest.prompt_tokens, longest.output_tokens)
    if budget.blocks_for(tokens) > budget.num_blocks:
        raise UsageError(
            f"--kv-blocks {budget.num_blocks} x {budget.block_size} tokens hold"
            f" {budget.num_tokens} tokens; the trace's longest request ({longest.prompt_tokens}"
            f" prompt + {longest.output_tokens} output tokens) needs {budget.blocks_for(tokens)}"
            " blocks: give at least that"
        )


def _set_duration(ns: argparse.Namespace) -> list[RatePhase] | None:
    """Sets ``ns.duration`` (--phases and --rate-phases set it; 600 s when nothing does) and
    returns the parsed --rate-phases."""
    if ns.phases is not None and ns.duration is not None:
        raise UsageError("--phases sets the duration; drop --duration")
    if ns.phases is not None:
        ns.duration = sum(phase.duration_s for phase in ns.phases)
    rate_phases = None
    if ns.rate_phases is not None:
        if ns.duration is not None:
            raise UsageError("--rate-phases sets the duration; drop --duration")
        try:
            rate_phases = parse_rate_phases(ns.rate_phases)
        except ValueError as exc:
            raise UsageError(f"--rate-phases: {exc}") from None
        ns.duration = sum(phase.duration_s for phase in rate_phases)
    ns.duration = 600.0 if ns.duration is None else ns.duration
    return rate_phases


def _scenarios(
    ns: argparse.Namespace, trace: list[TraceRequest], rate_phases: list[RatePhase] | None
) -> list[tuple[str, Workload]]:
    """The loads to run, each with its name in the tables."""
    scenarios: list[tuple[str, Workload]] = []
    if ns.conversations is not None:
        return [(f"conversations {ns.conversations:g}/s cv={ns.cv}",
                 conversation_workload(ns, trace))]  # fmt: skip
    if ns.rate is not None or rate_phases is not None:  # each seed draws its own arrivals
        name = f"rate={ns.rate}" if ns.rate is not None else f"rate phases {ns.rate_phases}"
        rate_phases = rate_phases or [RatePhase(ns.duration, ns.rate)]
        scenarios.append((f"{name} cv={ns.cv}", Workload(trace, rate_phases=rate_phases,
                          cv=ns.cv, warmup_s=ns.warmup)))  # fmt: skip
    elif ns.replay:
        arrivals = [r for r in scale_time(trace, ns.time_scale) if r.arrival_s < ns.duration]
        scenarios.append((f"replay x{ns.time_scale}", Workload(trace, arrivals=arrivals,
                          duration_s=ns.duration, warmup_s=ns.warmup)))  # fmt: skip
    elif ns.phases is not None:
        text = ",".join(f"{p.duration_s:g}:{p.clients}" for p in ns.phases)
        scenarios.append((f"phases {text}", Workload(trace, phases=ns.phases,
                          warmup_s=ns.warmup)))  # fmt: skip
    else:
        for c in ns.concurrency or [220, 250]:
            scenarios.append((f"c={c}", Workload(trace, concurrency=c, duration_s=ns.duration,
                              warmup_s=ns.warmup)))  # fmt: skip
    return scenarios


def _run_seeds(
    ns: argparse.Namespace,
    scenarios: list[tuple[str, Workload]],
    base: ClusterConfig,
    tune: TuneConfig | None,
) -> dict[tuple[str, float], list[RunResult]]:
    """Every scenario x paused cap x seed, in ``ns.jobs`` processes."""
    modes = list(ns.modes)
    if ns.target_output_tps is None and "target_output_tps" in modes and "off" not in modes:
        modes.insert(0, "off")  # T = auto is defined by the off run
    jobs = []
    for name, workload in scenarios:
        for fraction in ns.paused_cap_fraction or [DEFAULT_PAUSED_CAP_FRACTION]:
            config = replace(base, paused_cap_fraction=fraction)
            for seed in range(ns.seeds):
                keep = seed == 0 and ns.plot is not None
                jobs.append(((name, fraction), (config, workload, modes, seed,
                             ns.target_output_tps, keep, tune)))  # fmt: skip
    results: dict[tuple[str, float], list[RunResult]] = {key: [] for key, _ in jobs}
    with ProcessPoolExecutor(max_workers=ns.jobs) as pool:
        futures = [(key, pool.submit(_job, args)) for key, args in jobs]
        for key, future in _progress(futures):
            results[key] += future.result()
    return results


def _progress(futures: list):  # type: ignore[no-untyped-def,type-arg]
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is in the sim extra
        return futures
    return tqdm(futures, desc="simulating", unit="seed", file=sys.stderr)


def report(ns: argparse.Namespace, results: dict[tuple[str, float], list[RunResult]]) -> int:
    document: dict[str, object] = {"args": {k: str(v) for k, v in vars(ns).items()}, "runs": []}
    for (name, fraction), runs in results.items():
        summary = summarize(runs)
        target = summary.get("off", summary[next(iter(summary))])["target_output_tps"]["mean"]
        title = f"\n== {name}, paused cap {fraction} A, T = {target:.2f} tok/s, {ns.seeds} seeds =="
        print(format_table(summary, title))
        if ns.classes:
            print(format_class_table(summary, ns.classes))
        if ns.stat_lines:
            for run in runs:
                if run.seed == 0:
                    for worker, line in run.stat_lines[:16]:
                        print(f"[{run.mode} worker {worker}] {line}")
        if ns.tune:
            _print_tuning(runs)
        document["runs"].append({  # type: ignore[attr-defined]
            "scenario": name, "paused_cap_fraction": fraction, "summary": summary,
            "per_seed": [{"mode": r.mode, "seed": r.seed, "target_output_tps":
                          r.target_output_tps, "metrics": r.metrics}
                         | ({"tuning": r.tuning} if r.tuning else {}) for r in runs],
        } | ({"classes": class_summary(summary, ns.classes)} if ns.classes else {}))  # fmt: skip
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(document, indent=1, allow_nan=True))
    if ns.plot:
        from genpool_sim.plots import write_plots

        write_plots(results, ns.plot)
    return 0


def _print_tuning(runs: list[RunResult]) -> None:
    for run in runs:
        changes = [d for d in run.tuning if d["changed"]]
        if not run.tuning:
            continue
        steps = " ".join(f"t={d['t']:g}:{d['reason']}->H{d['headroom']}/P{d['cap']}"
                         for d in changes)  # fmt: skip
        print(f"tuner seed {run.seed}: {len(changes)} change(s) {steps or '(none)'}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        if ns.command == "sim":
            return run_sim(ns)
    except (UsageError, TraceError, AutoscaleUsageError, PrefixUsageError) as exc:
        print(f"genpool: error: {exc}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
