"""Aggregate runs over seeds: means, paired deltas vs ``off`` with 95% CIs, the tables
(all requests; per request class with ``--classes``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from genpool_core.names import SLO_MODE
from genpool_sim.experiment import PER_REQUEST_MODE, RunResult
from genpool_sim.slo_classes import SloClass

# Two-sided 95% Student t quantiles by degrees of freedom (1..30); 1.96 beyond.
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
        2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]  # fmt: skip

TABLE_METRICS = (
    ("ttft_p50", "TTFT p50 s"),
    ("ttft_p90", "TTFT p90 s"),
    ("ttft_p99", "TTFT p99 s"),
    ("admission_wait_p50", "wait p50 s"),
    ("admission_wait_p90", "wait p90 s"),
    ("admission_wait_p99", "wait p99 s"),
    ("e2e_p50", "E2E p50 s"),
    ("e2e_p90", "E2E p90 s"),
    ("e2e_p99", "E2E p99 s"),
    ("tpot_mean", "TPOT mean s"),
    ("tpot_p90", "TPOT p90 s"),
    ("below_target", "below T"),
    ("output_tokens_per_s", "tok/s"),
)
# With a KV budget (--kv-blocks): per worker, time-weighted (genpool_sim.kv_memory.KVGauge);
# the shares are of worker time, or of the worker's blocks for "KV used".
KV_TABLE_METRICS = (
    ("kv_used_share", "KV used"),
    ("kv_paused_blocks_mean", "KV blocks paused, mean"),
    ("kv_paused_blocks_p99", "KV blocks paused, p99"),
    ("kv_memory_bound", "head waits on memory"),
    ("kv_caps_bound", "head waits on B, H"),
    ("residents_mean", "residents, mean"),
    ("kv_resident_capacity", "residents the KV holds"),
    ("kv_paused_share", "KV held by paused"),
)
# With --conversations (genpool_sim.prefix_metrics): the prefix cache and what it does
# to later turns and to pausing's memory.
PREFIX_TABLE_METRICS = (
    ("prefix_hit_rate", "prefix hit rate"),
    ("prefix_oracle_hit_rate", "oracle hit rate"),
    ("ttft_turn1_p90", "TTFT p90 s, turn 1"),
    ("ttft_turns2_p50", "TTFT p50 s, turns >= 2"),
    ("ttft_turns2_p90", "TTFT p90 s, turns >= 2"),
    ("kv_paused_only_share", "KV held by paused only"),
    ("pauses_per_request", "pauses/request"),
)
_KV_SHARES = ("kv_used_share", "kv_memory_bound", "kv_caps_bound", "kv_paused_share",
              "kv_paused_only_share", "prefix_hit_rate", "prefix_oracle_hit_rate")  # fmt: skip


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (t distribution)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n == 1:
        return mean, math.nan
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    t = _T95[n - 2] if n - 1 <= len(_T95) else 1.96
    return mean, t * math.sqrt(var / n)


def summarize(results: Sequence[RunResult]) -> dict[str, dict[str, dict[str, float]]]:
    """{mode: {metric: {mean, ci, delta, delta_ci, delta_pct}}} over the seeds."""
    by_mode: dict[str, dict[int, RunResult]] = {}
    for result in results:
        by_mode.setdefault(result.mode, {})[result.seed] = result
    off = by_mode.get("off", {})
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for mode, runs in by_mode.items():
        summary[mode] = {}
        names = sorted({k for r in runs.values() for k in r.metrics})
        for name in names:
            values = [r.metrics[name] for r in runs.values() if name in r.metrics]
            mean, ci = mean_ci(values)
            entry = {"mean": mean, "ci95": ci, "seeds": float(len(values))}
            paired = [
                (r.metrics[name], off[s].metrics[name])
                for s, r in runs.items()
                if s in off and name in r.metrics and name in off[s].metrics
            ]
            if paired and mode != "off":
                delta, delta_ci = mean_ci([a - b for a, b in paired])
                base = sum(b for _, b in paired) / len(paired)
                entry |= {"delta": delta, "delta_ci95": delta_ci}
                entry["delta_pct"] = 100.0 * delta / base if base else math.nan
            if mode == PER_REQUEST_MODE:  # the comparison that matters: one pool T
                entry |= _paired(runs, by_mode.get(SLO_MODE, {}), name, "vs_pool_t_")
            summary[mode][name] = entry
        targets = [r.target_output_tps for r in runs.values() if r.target_output_tps]
        summary[mode]["target_output_tps"] = {"mean": mean_ci(targets)[0] if targets else math.nan}
    return summary


def _paired(
    runs: dict[int, RunResult], baseline: dict[int, RunResult], name: str, prefix: str
) -> dict[str, float]:
    """``{prefix}delta`` and its 95% CI, paired by seed against ``baseline``."""
    pairs = [
        r.metrics[name] - baseline[s].metrics[name]
        for s, r in runs.items()
        if s in baseline and name in r.metrics and name in baseline[s].metrics
    ]
    if not pairs:
        return {}
    delta, ci = mean_ci(pairs)
    return {f"{prefix}delta": delta, f"{prefix}delta_ci95": ci}


def _cell(entry: dict[str, float] | None, is_ratio: bool) -> str:
    if entry is None or math.isnan(entry["mean"]):
        return "-"
    if is_ratio:
        text = f"{100 * entry['mean']:.1f}%"
    elif entry["mean"] >= 100:
        text = f"{entry['mean']:.0f}"
    else:
        text = f"{entry['mean']:.3f}"
    if "delta_pct" in entry and not math.isnan(entry["delta_pct"]):
        half = entry.get("delta_ci95", math.nan)
        scale = 100.0 if is_ratio else 1.0
        unit = "pt" if is_ratio else ""
        text += f" ({entry['delta'] * scale:+.3g}{unit} ±{half * scale:.2g})"
    return text


def format_table(summary: dict[str, dict[str, dict[str, float]]], title: str = "") -> str:
    modes = list(summary)
    is_prefix = any("prefix_hit_rate" in summary[m] for m in modes)
    extra: tuple[tuple[str, str], ...] = KV_TABLE_METRICS + (
        PREFIX_TABLE_METRICS if is_prefix else ()
    )
    shown = TABLE_METRICS + tuple(
        (key, label) for key, label in extra if any(key in summary[m] for m in modes)
    )
    rows = [[label] + [_cell(summary[m].get(key), key in ("below_target", *_KV_SHARES))
                       for m in modes] for key, label in shown]  # fmt: skip
    header = ["metric (mean over seeds; delta vs off ±95% CI)", *modes]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [title] if title else []
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


# Per-class rows: (metric suffix, label, is a ratio).
CLASS_METRICS = (
    ("below_target", "below own floor", True),
    ("wait_over_target", "wait > D_i", True),
    ("ttft_p90", "TTFT p90 s", False),
    ("requests", "requests", False),
)


def class_summary(
    summary: dict[str, dict[str, dict[str, float]]], classes: Sequence[SloClass]
) -> dict[str, dict[str, object]]:
    """{class: {share, tpot_ms, ttft_ms, modes: {mode: {metric: {mean, ci95, ...}}}}}."""
    out: dict[str, dict[str, object]] = {}
    for slo_class in classes:
        prefix = f"class.{slo_class.name}."
        modes = {
            mode: {k.removeprefix(prefix): v for k, v in metrics.items() if k.startswith(prefix)}
            for mode, metrics in summary.items()
        }
        out[slo_class.name] = {"share": slo_class.share, "tpot_ms": slo_class.tpot_ms,
                               "ttft_ms": slo_class.ttft_ms, "modes": modes}  # fmt: skip
    return out


def _mean_ci_cell(entry: dict[str, float] | None, is_ratio: bool) -> str:
    if entry is None or math.isnan(entry["mean"]):
        return "-"
    scale, unit = (100.0, "%") if is_ratio else (1.0, "")
    text = f"{entry['mean'] * scale:.1f}{unit}" if is_ratio else f"{entry['mean']:.3g}"
    half = entry.get("ci95", math.nan)
    text = text if math.isnan(half) else f"{text} ±{half * scale:.2g}{unit}"
    if "vs_pool_t_delta" in entry:
        unit = "pt" if is_ratio else ""
        delta, delta_ci = entry["vs_pool_t_delta"], entry["vs_pool_t_delta_ci95"]
        text += f" ({delta * scale:+.3g}{unit} ±{delta_ci * scale:.2g} vs pool T)"
    return text


def format_class_table(
    summary: dict[str, dict[str, dict[str, float]]], classes: Sequence[SloClass]
) -> str:
    """One row per class and metric, one column per mode: mean ±95% CI over seeds."""
    modes = list(summary)
    rows = []
    for slo_class in classes:
        floor = f"tpot {slo_class.tpot_ms:g} ms" if slo_class.tpot_ms else "pool T"
        for suffix, label, is_ratio in CLASS_METRICS:
            key = f"class.{slo_class.name}.{suffix}"
            if any(key in summary[m] for m in modes):
                cells = [_mean_ci_cell(summary[m].get(key), is_ratio) for m in modes]
                rows.append([f"{slo_class.name} ({floor}) {label}", *cells])
    header = ["class metric (mean ±95% CI over seeds; per_request_tps: paired delta)", *modes]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)
