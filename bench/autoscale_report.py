"""The replica-law study's arithmetic, pure (unit-tested in tests/unit/sim): the oracle's
replicas per rate, its schedule, per-policy summaries over seeds, paired ratios and
the goals of issue 32."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from genpool_sim.report import mean_ci
from genpool_sim.workload import RatePhase

MIN_WINDOWS_MET = 0.95  # the goal: SLO windows met, mean over seeds
MAX_VS_ORACLE = 1.15
MAX_VS_STATIC = 0.85
MAX_VS_REPLICAS_ONLY = 0.85

Metrics = Mapping[str, float]


def fewest_meeting(met_by_count: Mapping[int, Sequence[float]]) -> int | None:
    """The fewest replicas whose mean SLO windows met (over seeds) reach the goal."""
    meeting = [n for n, met in met_by_count.items() if met and _mean(met) >= MIN_WINDOWS_MET]
    return min(meeting) if meeting else None


def oracle_schedule(
    phases: Sequence[RatePhase], need: Mapping[float, int]
) -> tuple[tuple[float, int], ...]:
    """(phase start, replicas) per phase from the replicas each rate needs; a phase
    with the count of the one before adds no entry."""
    schedule: list[tuple[float, int]] = []
    start = 0.0
    for phase in phases:
        count = need[rate_key(phase.rate)]
        if not schedule or schedule[-1][1] != count:
            schedule.append((start, count))
        start += phase.duration_s
    return tuple(schedule)


def rate_key(rate: float) -> float:
    """How a rate is looked up in the oracle's table (float noise folded)."""
    return round(rate, 6)


def summarize(runs: Mapping[str, Sequence[Metrics]]) -> dict[str, dict[str, object]]:
    """{policy: replica-seconds mean and CI, SLO windows met mean and worst seed}."""
    summary: dict[str, dict[str, object]] = {}
    for policy, seeds in runs.items():
        cost = [m["replica_seconds"] for m in seeds]
        met = [m["slo_windows_met"] for m in seeds]
        mean, ci = mean_ci(cost)
        summary[policy] = {
            "replica_seconds": {"mean": mean, "ci95": ci},
            "slo_windows_met": {"mean": _mean(met), "min": min(met) if met else math.nan},
            "ttft_p90": _mean([m["ttft_p90"] for m in seeds]),
            "below_target": _mean([m["below_target"] for m in seeds]),
            "seeds": len(seeds),
        }
    return summary


def paired_ratio(
    runs: Mapping[str, Sequence[Metrics]], numerator: str, denominator: str
) -> dict[str, object] | None:
    """Replica-seconds of ``numerator`` over ``denominator``, seed by seed: mean, CI."""
    if numerator not in runs or denominator not in runs:
        return None
    pairs = zip(runs[numerator], runs[denominator], strict=True)
    ratios = [a["replica_seconds"] / b["replica_seconds"] for a, b in pairs]
    mean, ci = mean_ci(ratios)
    return {"mean": mean, "ci95": ci, "per_seed": ratios}


def goals(runs: Mapping[str, Sequence[Metrics]]) -> dict[str, object]:
    """Issue 32's goals for one load, each with its numbers and a verdict (``None``:
    the comparison is not in the runs; ``allowed`` False: the shape does not allow it,
    the oracle itself is not 0.85x the static pool)."""
    summary = summarize(runs)
    genpool = summary.get("genpool")
    if genpool is None:
        return {}
    met = _mean_of(genpool["slo_windows_met"])
    result: dict[str, object] = {"windows_met": {"value": met, "met": met >= MIN_WINDOWS_MET}}
    oracle = paired_ratio(runs, "genpool", "oracle")
    if oracle is not None:
        result["vs_oracle"] = _verdict(oracle, MAX_VS_ORACLE)
    static = paired_ratio(runs, "genpool", "static")
    if static is not None:
        verdict = _verdict(static, MAX_VS_STATIC)
        shape_allows = paired_ratio(runs, "oracle", "static")
        verdict["allowed"] = shape_allows is None or _mean_of(shape_allows) <= MAX_VS_STATIC
        result["vs_static"] = verdict
    planner = paired_ratio(runs, "genpool", "replicas-only")
    if planner is not None:
        result["vs_replicas_only"] = _verdict(planner, MAX_VS_REPLICAS_ONLY)
    llmd = paired_ratio(runs, "genpool", "llm-d-slo")
    if llmd is not None:
        llmd_met = _mean_of(summary["llm-d-slo"]["slo_windows_met"])
        verdict = _verdict(llmd, 1.0, strict=True)
        verdict["met"] = bool(verdict["met"]) and met >= llmd_met
        verdict["llm_d_windows_met"] = llmd_met
        result["vs_llm_d_slo"] = verdict
    return result


def _verdict(
    ratio: Mapping[str, object], bound: float, *, strict: bool = False
) -> dict[str, object]:
    value = _mean_of(ratio)
    met = value < bound if strict else value <= bound
    return {"value": value, "ci95": ratio["ci95"], "bound": bound, "met": met}


def _mean_of(entry: object) -> float:
    assert isinstance(entry, Mapping)
    value = entry["mean"]
    assert isinstance(value, float)
    return value


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan
