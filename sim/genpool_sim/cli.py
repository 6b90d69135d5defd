"""``genpool sim``: the simulator of docs/design.md#simulator (``genpool_cli`` dispatches here).

This module does the I/O (files, processes, progress bar, plots); everything it
calls in ``genpool_sim`` is pure and seeded.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from genpool_core.knobs import KnobBounds
from genpool_core.tuner import TunerSettings
from genpool_sim.autoscale_cli import AutoscaleUsageError, add_autoscale_options, run_autoscale
from genpool_sim.cluster import MODES, ClusterConfig
from genpool_sim.datafiles import AZURE_CONV, data_file
from genpool_sim.experiment import RunResult, Workload, run_seed
from genpool_sim.report import format_table, summarize
from genpool_sim.tuning import Phase, TuneConfig, parse_phases
from genpool_sim.workload import (
    RatePhase,
    TraceError,
    TraceRequest,
    parse_csv_trace,
    parse_jsonl_trace,
    parse_rate_phases,
    scale_time,
)

DEFAULT_TRACE = data_file(AZURE_CONV)


class UsageError(Exception):
    """A bad command line: reported as argparse does, exit status 2."""


def _positive(kind: type[int] | type[float]):  # type: ignore[no-untyped-def]
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
        return value

    return parse


def _list_of(kind: type[int] | type[float]):  # type: ignore[no-untyped-def]
    item = _positive(kind)
    return lambda text: [item(part) for part in text.split(",") if part]


def _modes(text: str) -> list[str]:
    modes = [m for m in text.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise argparse.ArgumentTypeError(f"modes must be among {', '.join(MODES)}; got {text!r}")
    return modes


def _phases(text: str) -> list[Phase]:
    try:
        return parse_phases(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def _target(text: str) -> float | None:
    return None if text == "auto" else float(_positive(float)(text))


def build_parser() -> argparse.ArgumentParser:
    """`genpool sim FLAGS` (the parser sits under `genpool`, which dispatches to it)."""
    parser = argparse.ArgumentParser(prog="genpool")
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser(
        "sim",
        help="simulate a disaggregated GEN pool (docs/design.md#simulator)",
        description="Simulate a disaggregated GEN pool (docs/design.md#simulator).",
    )
    sim.add_argument(
        "--trace",
        type=Path,
        default=DEFAULT_TRACE,
        help="request trace: CSV (arrived_at,num_prefill_tokens,num_decode_tokens) or JSONL"
        " (default: the Azure conversation trace)",
    )
    _add_load_options(sim)
    sim.add_argument("--workers", type=_positive(int), default=8, help="GEN workers (default: 8)")
    sim.add_argument(
        "--max-batch",
        type=_positive(int),
        default=16,
        help="A: requests a worker decodes per step (default: 16)",
    )
    sim.add_argument(
        "--ctx-servers",
        type=_positive(int),
        default=4,
        help="context (prefill) servers ahead of the pool (default: 4)",
    )
    sim.add_argument(
        "--modes",
        type=_modes,
        default=list(MODES),
        help=f"preemption modes to compare, comma-separated (default: {','.join(MODES)})",
    )
    sim.add_argument(
        "--target-output-tps",
        type=_target,
        default=None,
        help="T of target_output_tps, output tokens/s per worker, or auto: the off run's"
        " (default: auto)",
    )
    sim.add_argument(
        "--paused-cap-fraction",
        type=_list_of(float),
        default=[0.375],
        help="P (paused cap) as a fraction of A; a comma-separated list gives the trade-off"
        " curve (default: 0.375)",
    )
    sim.add_argument(
        "--tpot-budget",
        type=_positive(float),
        default=0.1,
        help="TPOT budget of tpot_budget, seconds per output token (default: 0.1)",
    )
    _add_output_options(sim)
    _add_tune_options(sim)
    add_autoscale_options(sim)
    return parser


def _add_load_options(sim: argparse.ArgumentParser) -> None:
    load = sim.add_mutually_exclusive_group()
    load.add_argument(
        "--concurrency",
        type=_list_of(int),
        default=None,
        help="closed loop: number of clients; a comma-separated list runs each (default: 220,250)",
    )
    load.add_argument(
        "--rate", type=_positive(float), help="open loop: Gamma arrivals at this rate, requests/s"
    )
    load.add_argument(
        "--rate-phases",
        help="open loop whose rate changes: SECONDS:RATE,... in requests/s (sets the duration)",
    )
    load.add_argument(
        "--replay", action="store_true", help="open loop: the trace's own arrival times"
    )
    load.add_argument(
        "--phases",
        type=_phases,
        help="closed loop whose number of clients changes: SECONDS:CLIENTS,... (sets the duration)",
    )
    sim.add_argument(
        "--cv",
        type=_positive(float),
        default=1.0,
        help="coefficient of variation of the Gamma inter-arrival times, unitless"
        " (1: Poisson; default: 1)",
    )
    sim.add_argument(
        "--time-scale",
        type=_positive(float),
        default=1.0,
        help="factor on replayed arrival times, unitless (below 1: more load; default: 1)",
    )
    sim.add_argument("--duration", type=_positive(float), help="simulated seconds (default: 600)")
    sim.add_argument(
        "--warmup",
        type=float,
        default=60.0,
        help="simulated seconds excluded from the metrics (default: 60)",
    )


def _add_output_options(sim: argparse.ArgumentParser) -> None:
    sim.add_argument(
        "--seeds",
        type=_positive(int),
        default=4,
        help="runs per setting, seeds 0..N-1 (default: 4)",
    )
    sim.add_argument(
        "--jobs",
        type=_positive(int),
        default=2,
        help="simulations in parallel processes (default: 2)",
    )
    sim.add_argument("--json", type=Path, help="write all results as JSON to this file")
    sim.add_argument("--plot", type=Path, help="write PNG plots into this folder")
    sim.add_argument(
        "--stat-lines", action="store_true", help="print seed 0's stat lines (16 per run)"
    )


def _add_tune_options(sim: argparse.ArgumentParser) -> None:
    tune = sim.add_argument_group("tuner in the loop (target_output_tps runs)")
    tune.add_argument("--tune", action="store_true", help="run the tuner (docs/design.md#tuner)")
    tune.add_argument(
        "--tune-interval",
        type=_positive(float),
        default=30.0,
        help="simulated seconds between tuner rounds (default: 30)",
    )
    tune.add_argument(
        "--headroom-min", type=_count, default=0, help="lowest H, requests (default: 0)"
    )
    tune.add_argument("--headroom-max", type=_count, help="highest H, requests (default: A)")
    tune.add_argument("--cap-min", type=_count, default=0, help="lowest P, requests (default: 0)")
    tune.add_argument("--cap-max", type=_count, help="highest P, requests (default: A)")
    tune.add_argument(
        "--tune-cooldown",
        type=_count,
        default=2,
        help="tuner rounds without a change after one (default: 2)",
    )
    tune.add_argument(
        "--tune-rule",
        choices=("guarded", "literal"),
        default="guarded",
        help="literal: lower the cap on any miss above eps (docs/design.md#tuner as"
        " specified); guarded: only when the cap is implicated in the miss (default: guarded)",
    )


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
    tune = tune_config(ns)
    if not 0 <= ns.warmup < ns.duration:
        raise UsageError("need 0 <= --warmup < --duration")
    scenarios: list[tuple[str, Workload]] = []
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
    base = ClusterConfig(workers=ns.workers, max_batch=ns.max_batch, ctx_servers=ns.ctx_servers,
                         tpot_budget=ns.tpot_budget)  # fmt: skip
    if ns.autoscale:
        if len(scenarios) != 1:
            raise UsageError("--autoscale runs one load: give one --concurrency value")
        name, workload = scenarios[0]
        fraction = ns.paused_cap_fraction[0]
        return run_autoscale(ns, name, workload, replace(base, paused_cap_fraction=fraction), tune)
    modes = list(ns.modes)
    if ns.target_output_tps is None and "target_output_tps" in modes and "off" not in modes:
        modes.insert(0, "off")  # T = auto is defined by the off run
    jobs = []
    for name, workload in scenarios:
        for fraction in ns.paused_cap_fraction:
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
    return report(ns, results)


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
        })  # fmt: skip
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
    except (UsageError, TraceError, AutoscaleUsageError) as exc:
        print(f"genpool: error: {exc}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
