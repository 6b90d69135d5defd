"""bench/scheduler.py's summaries and targets: percentiles of the pass times, the targets
at 256 residents / 1024 waiters, the pass with KV blocks against the pass without, the
table ``bench.run`` prints."""

from __future__ import annotations

import math
import statistics
from typing import Any

TARGET_MEDIAN_STEP_US = 100.0  # targets at 256 residents / 1024 waiters, every mode
TARGET_P99_STEP_US = 300.0
TARGET_RATIO_TO_OFF = 2.0  # a preemption mode's median pass vs off's, in the same run
TARGET_SCALE = "256/1024"
KV_SUFFIX = "+kv"  # a runner whose scheduler has a KV budget: "<mode>+kv"
# Prompts this worker prefills (with block hashes, half of them sharing a 1024-token
# prefix), with KV blocks: "<mode>+prefill" without prefix caching, "<mode>+cache" with it.
PREFILL_SUFFIX = "+prefill"
CACHE_SUFFIX = "+cache"
SUFFIXES = (KV_SUFFIX, PREFILL_SUFFIX, CACHE_SUFFIX)


def summary_us(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)
    n = len(ordered)

    def rank(q: float) -> float:  # nearest-rank percentile
        return ordered[max(0, math.ceil(q * n) - 1)] / 1000.0

    return {
        "median": round(statistics.median(ordered) / 1000.0, 2),
        "p90": round(rank(0.90), 2),
        "p99": round(rank(0.99), 2),
        "mean": round(statistics.fmean(ordered) / 1000.0, 2),
        "min": round(ordered[0] / 1000.0, 2),
        "max": round(ordered[-1] / 1000.0, 2),
    }


def targets(at_target: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The targets on the passes without a KV budget (``kv_side_by_side`` adds blocks)."""
    plain = {mode: r for mode, r in at_target.items() if not mode.endswith(SUFFIXES)}
    medians = {mode: r["step_us"]["median"] for mode, r in plain.items()}
    p99s = {mode: r["step_us"]["p99"] for mode, r in plain.items()}
    off = medians["off"]
    ratios = {mode: round(m / off, 2) for mode, m in medians.items() if mode != "off"}
    return {
        "scale": TARGET_SCALE,
        "medians_us": medians,
        "p99s_us": p99s,
        "ratios_to_off": ratios,
        "limits": {
            "median_us": TARGET_MEDIAN_STEP_US,
            "p99_us": TARGET_P99_STEP_US,
            "ratio_to_off": TARGET_RATIO_TO_OFF,
        },
        "met": {
            mode: {
                "median": medians[mode] < TARGET_MEDIAN_STEP_US,
                "p99": p99s[mode] < TARGET_P99_STEP_US,
                **({"ratio": ratios[mode] <= TARGET_RATIO_TO_OFF} if mode in ratios else {}),
            }
            for mode in medians
        },
    }


def kv_side_by_side(configs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per scale and mode: the median pass without and with KV blocks, measured side by
    side, and whether the two made the same decisions (the budget never binds here)."""
    out: dict[str, dict[str, Any]] = {}
    for scale, runs in configs.items():
        out[scale] = {}
        for mode, plain in runs.items():
            with_kv = runs.get(mode + KV_SUFFIX)
            if mode.endswith(KV_SUFFIX) or with_kv is None:
                continue
            median, median_kv = plain["step_us"]["median"], with_kv["step_us"]["median"]
            out[scale][mode] = {
                "median_us": median,
                "median_us_kv": median_kv,
                "p99_us": plain["step_us"]["p99"],
                "p99_us_kv": with_kv["step_us"]["p99"],
                "ratio": round(median_kv / median, 2),
                "same_decisions": _decisions(plain) == _decisions(with_kv),
            }
    return out


def cache_side_by_side(configs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per scale and mode: the pass with prompts this worker prefills, without and with
    the prefix cache, side by side (the budget never binds: the same decisions)."""
    out: dict[str, dict[str, Any]] = {}
    for scale, runs in configs.items():
        out[scale] = {}
        for name, without in runs.items():
            mode = name.removesuffix(PREFILL_SUFFIX)
            with_cache = runs.get(mode + CACHE_SUFFIX)
            if not name.endswith(PREFILL_SUFFIX) or with_cache is None:
                continue
            median, median_cache = without["step_us"]["median"], with_cache["step_us"]["median"]
            out[scale][mode] = {
                "median_us": median,
                "median_us_cache": median_cache,
                "p99_us": without["step_us"]["p99"],
                "p99_us_cache": with_cache["step_us"]["p99"],
                "ratio": round(median_cache / median, 2),
                "same_decisions": _decisions(without) == _decisions(with_cache),
                "met": median_cache < TARGET_MEDIAN_STEP_US,
            }
    return out


def kv_target(side_by_side: dict[str, dict[str, Any]]) -> dict[str, Any]:
    rows = side_by_side[TARGET_SCALE]
    return {
        "scale": TARGET_SCALE,
        "median_us": TARGET_MEDIAN_STEP_US,
        "met": {mode: row["median_us_kv"] < TARGET_MEDIAN_STEP_US for mode, row in rows.items()},
    }


def _decisions(result: dict[str, Any]) -> tuple[int, ...]:
    activity = result["activity"]
    return tuple(activity[k] for k in ("admitted", "finished", "paused", "resumed"))


def format_table(result: dict[str, Any]) -> str:
    env = result["environment"]
    lines = [
        f"Python {env['python']} ({env['implementation']}), {env['cpu_count']} CPUs"
        + ("  [QUICK run: numbers not meaningful]" if result.get("quick") else ""),
        f"{'scale':>9} {'mode':<18} {'step med':>9} {'p99':>8} {'mean':>8} "
        f"{'post med':>9} {'p99':>8} {'res':>6} {'act':>6} {'paused':>6} "
        f"{'pauses':>7} {'resumes':>7}",
    ]
    for scale_name, modes in result["configs"].items():
        for mode, r in modes.items():
            s, q, o, a = r["step_us"], r["postprocess_us"], r["observed_mean"], r["activity"]
            lines.append(
                f"{scale_name:>9} {mode:<18} {s['median']:>9.1f} {s['p99']:>8.1f} "
                f"{s['mean']:>8.1f} {q['median']:>9.1f} {q['p99']:>8.1f} "
                f"{o['residents']:>6.1f} {o['active']:>6.1f} {o['paused']:>6.1f} "
                f"{a['paused']:>7} {a['resumed']:>7}"
            )
    target = result["target"]
    verdict = ", ".join(
        f"{mode} {target['medians_us'][mode]:.1f} / p99 {target['p99s_us'][mode]:.1f}"
        + (
            f" / {target['ratios_to_off'][mode]:.2f}x off"
            if mode in target["ratios_to_off"]
            else ""
        )
        + (" (met)" if all(met.values()) else " (NOT met)")
        for mode, met in target["met"].items()
    )
    limits = target["limits"]
    lines.append(
        f"target at {target['scale']}: median < {limits['median_us']:.0f} us, "
        f"p99 < {limits['p99_us']:.0f} us, <= {limits['ratio_to_off']:.0f}x off: {verdict}"
    )
    for scale_name, modes in result["kv"].items():
        cells = ", ".join(
            f"{mode} {row['median_us']:.1f} -> {row['median_us_kv']:.1f} ({row['ratio']:.2f}x)"
            for mode, row in modes.items()
        )
        lines.append(f"with KV blocks at {scale_name}, median: {cells}")
    kv_met = result["kv_target"]["met"]
    lines.append(
        f"with KV blocks at {result['kv_target']['scale']}: median < "
        f"{TARGET_MEDIAN_STEP_US:.0f} us: "
        + ", ".join(f"{m} {'met' if ok else 'NOT met'}" for m, ok in kv_met.items())
    )
    lines.append("(times in microseconds; res/act/paused: mean over measured passes)")
    return "\n".join(lines)
