"""``genpool sim --autoscale``: its flags, the runs (one process job per policy and
seed), the table, the JSON and the plots. ``cli.run_sim`` hands over here."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from genpool_core.field_help import help_for
from genpool_core.knobs import KnobBounds
from genpool_sim.autoscale import (
    DEFAULT_POLICIES,
    POLICIES,
    SUMMARY_METRICS,
    AutoscaleConfig,
    PolicyRun,
    run_policy,
    summarize_policies,
)
from genpool_sim.cluster import ClusterConfig
from genpool_sim.experiment import Workload
from genpool_sim.pool_control import TuneConfig


class AutoscaleUsageError(ValueError):
    """A bad autoscale flag; the message names it (the CLI prints one line, exit 2)."""


def add_autoscale_options(sim: argparse.ArgumentParser) -> None:
    group = sim.add_argument_group("replicas that come and go (--autoscale)")
    group.add_argument("--autoscale", action="store_true",
                       help="compare the replica policies on the same seeds")  # fmt: skip
    group.add_argument(
        "--policies",
        default=",".join(DEFAULT_POLICIES),
        help=f"comma-separated, among {', '.join(POLICIES)} (default:"
        f" {','.join(DEFAULT_POLICIES)}; oracle needs --schedule)",
    )
    group.add_argument(
        "--schedule",
        help=help_for(
            AutoscaleConfig,
            "schedule",
            note="as SECONDS:REPLICAS,...; each"
            " phase's replicas start early enough to serve from its first second",
        ),
    )
    group.add_argument("--learn-days", default="0", help=help_for(AutoscaleConfig, "learn_days"))
    group.add_argument(
        "--slo-ttft-p90",
        help=help_for(AutoscaleConfig, "slo_ttft_p90_s", note="required with --autoscale"),
    )
    group.add_argument(
        "--slo-attainment", default="0.8", help=help_for(AutoscaleConfig, "attainment")
    )
    group.add_argument(
        "--min-replicas", default="1", help=help_for(AutoscaleConfig, "min_replicas", default=1)
    )
    group.add_argument(
        "--max-replicas", default="32", help=help_for(AutoscaleConfig, "max_replicas", default=32)
    )
    group.add_argument(
        "--startup-delay", default="60", help=help_for(AutoscaleConfig, "startup_delay_s")
    )
    group.add_argument(
        "--scale-interval", default="30", help=help_for(AutoscaleConfig, "interval_s")
    )
    group.add_argument("--capacity-override", help=help_for(AutoscaleConfig, "capacity_override"))


def _number(ns: argparse.Namespace, name: str, kind: type[float] | type[int]) -> float:
    flag = "--" + name.replace("_", "-")
    text = getattr(ns, name)
    if text is None:
        raise AutoscaleUsageError(f"{flag} is required with --autoscale")
    try:
        value = kind(text)
    except ValueError:
        raise AutoscaleUsageError(f"{flag}: not a number: {text!r}") from None
    if not math.isfinite(value):
        raise AutoscaleUsageError(f"{flag}: must be finite: {text!r}")
    return value


_SHARE = "must be in (0, 1]"


def autoscale_config(ns: argparse.Namespace) -> AutoscaleConfig:
    """The flags, each checked with an error that names it."""
    values = {
        "slo_ttft_p90": _number(ns, "slo_ttft_p90", float),
        "slo_attainment": _number(ns, "slo_attainment", float),
        "min_replicas": _number(ns, "min_replicas", int),
        "max_replicas": _number(ns, "max_replicas", int),
        "startup_delay": _number(ns, "startup_delay", float),
        "scale_interval": _number(ns, "scale_interval", float),
        "learn_days": _number(ns, "learn_days", int),
    }
    checks = (
        ("slo_ttft_p90", values["slo_ttft_p90"] > 0, "must be > 0 s"),
        ("slo_attainment", 0 < values["slo_attainment"] < 1, "must be in (0, 1)"),
        ("min_replicas", values["min_replicas"] >= 1, "must be >= 1"),
        ("startup_delay", values["startup_delay"] >= 0, "must be >= 0 s"),
        ("scale_interval", values["scale_interval"] > 0, "must be > 0 s"),
        ("learn_days", 0 <= values["learn_days"] <= 30, "must be in 0..30"),
    )
    for name, ok, what in checks:
        if not ok:
            flag = "--" + name.replace("_", "-")
            raise AutoscaleUsageError(f"{flag}: {what}, got {getattr(ns, name)}")
    if values["min_replicas"] > values["max_replicas"]:
        raise AutoscaleUsageError(
            f"--min-replicas {ns.min_replicas} is above --max-replicas {ns.max_replicas}"
        )
    if ns.target_output_tps is None:
        raise AutoscaleUsageError("--target-output-tps: --autoscale needs a number (tok/s)")
    return AutoscaleConfig(
        slo_ttft_p90_s=values["slo_ttft_p90"],
        target_output_tps=ns.target_output_tps,
        min_replicas=int(values["min_replicas"]),
        max_replicas=int(values["max_replicas"]),
        attainment=values["slo_attainment"],
        startup_delay_s=values["startup_delay"],
        interval_s=values["scale_interval"],
        capacity_override=_override(ns),
        learn_days=int(values["learn_days"]),
        schedule=_schedule(ns),
    )


def _override(ns: argparse.Namespace) -> float | None:
    if ns.capacity_override is None:
        return None
    value = _number(ns, "capacity_override", float)
    if not 0 < value <= 1:
        raise AutoscaleUsageError(f"--capacity-override: {_SHARE}, got {ns.capacity_override}")
    return value


def _schedule(ns: argparse.Namespace) -> tuple[tuple[float, int], ...] | None:
    if ns.schedule is None:
        return None
    entries = []
    for item in ns.schedule.split(","):
        start, sep, count = item.partition(":")
        try:
            entry = (float(start), int(count))
        except ValueError:
            entry = None
        if not sep or entry is None or not math.isfinite(entry[0]) or entry[1] < 1:
            raise AutoscaleUsageError(f"--schedule: {item!r}: expected SECONDS:REPLICAS >= 1")
        entries.append(entry)
    if entries[0][0] != 0 or [t for t, _ in entries] != sorted(t for t, _ in entries):
        raise AutoscaleUsageError("--schedule: entries in time order, the first at 0")
    return tuple(entries)


def policies(ns: argparse.Namespace) -> list[str]:
    chosen = [p for p in ns.policies.split(",") if p]
    unknown = [p for p in chosen if p not in POLICIES]
    if "oracle" in chosen and ns.schedule is None:
        raise AutoscaleUsageError("--policies oracle needs --schedule")
    if unknown or not chosen:
        raise AutoscaleUsageError(f"--policies: choose among {', '.join(POLICIES)}, got "
                                  f"{ns.policies!r}")  # fmt: skip
    return chosen


def _job(
    args: tuple[str, ClusterConfig, Workload, int, AutoscaleConfig, TuneConfig],
) -> PolicyRun:
    return run_policy(*args)


def run_autoscale(
    ns: argparse.Namespace,
    name: str,
    workload: Workload,
    base: ClusterConfig,
    tune: TuneConfig | None,
) -> int:
    auto = autoscale_config(ns)
    chosen = policies(ns)
    a = base.max_batch
    tune = tune or TuneConfig(KnobBounds(0, a, 0, a))  # the genpool policy always tunes
    jobs = [(p, base, workload, s, auto, tune) for s in range(ns.seeds) for p in chosen]
    with ProcessPoolExecutor(max_workers=ns.jobs) as pool:
        runs = list(pool.map(_job, jobs))
    summary = summarize_policies(runs)
    print(format_policy_table(summary, f"\n== {name}, autoscale, {ns.seeds} seeds =="))
    document = {
        "args": {k: str(v) for k, v in vars(ns).items()},
        "runs": [{
            "scenario": name,
            "summary": summary,
            "per_seed": [{"policy": r.policy, "seed": r.seed, "metrics": r.metrics}
                         for r in runs],
            "timeline_seed0": {r.policy: r.timeline for r in runs if r.seed == 0},
        }],
    }  # fmt: skip
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(document, indent=1, allow_nan=True))
    if ns.plot:
        write_autoscale_plot([r for r in runs if r.seed == 0], auto, ns.plot / "autoscale.png")
    return 0


_LABELS = {
    "replica_seconds": "replica-seconds",
    "slo_windows_met": "SLO windows met",
    "ttft_p90": "GEN TTFT p90 s",
    "below_target": "below T",
    "tpot_mean": "TPOT mean s",
    "output_tokens_per_s": "tok/s",
}


def format_policy_table(summary: dict[str, dict[str, dict[str, float]]], title: str) -> str:
    names = list(summary)
    header = ["metric (mean ±95% CI over seeds)", *names]
    rows = [[_LABELS[key]] + [_cell(summary[p][key], key) for p in names]
            for key in SUMMARY_METRICS]  # fmt: skip
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def _cell(entry: dict[str, float], key: str) -> str:
    mean, ci = entry["mean"], entry["ci95"]
    if math.isnan(mean):
        return "-"
    if key in ("slo_windows_met", "below_target"):
        return f"{100 * mean:.1f}% ±{100 * ci:.1f}" if not math.isnan(ci) else f"{100 * mean:.1f}%"
    digits = 0 if abs(mean) >= 100 else 3
    return f"{mean:.{digits}f} ±{ci:.{digits}f}" if not math.isnan(ci) else f"{mean:.{digits}f}"


def write_autoscale_plot(runs: Sequence[PolicyRun], auto: AutoscaleConfig, path: Path) -> None:
    """Seed 0: the pool's GEN TTFT p90 per scaler window, and replicas, per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for run in runs:
        points = [(e["t"], e["ttft_p90"]) for e in run.timeline if e["ttft_p90"] is not None]
        if points:
            axes[0].plot(*zip(*points, strict=True), label=run.policy)
        steps = [(e["t"], e["ready"]) for e in run.timeline]
        axes[1].step(*zip(*steps, strict=True), where="post", label=run.policy)
    axes[0].axhline(auto.slo_ttft_p90_s, color="grey", linestyle="--", linewidth=0.8)
    axes[0].set(ylabel="GEN TTFT p90 s (window)", yscale="log", title="seed 0")
    axes[1].set(xlabel="simulated time (s)", ylabel="replicas serving")
    for axis in axes:
        axis.legend()
        axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot: {path}", file=sys.stderr)
