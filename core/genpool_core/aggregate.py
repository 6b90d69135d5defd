"""Pool-level statistics from the workers' stat lines (docs/design.md#stat-line, #operator).

Pure: the operator scrapes and parses, this module only adds up. Each worker's line
covers its own last window, so counters are summed and ratios are re-weighted by the
counts they were measured over (a worker that completed 3 requests must not weigh
as much as one that completed 300). Garbage (``None`` from ``parse_statline``) is
skipped, never fatal: one broken pod must not blind the tuner to the others.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from genpool_core import ttft_histogram
from genpool_core.statline import VICTIM_ORDER, StatLine

MIXED_MODE = "mixed"
_STATUS_VICTIM_KEYS = {
    "laxity": "laxity",
    "below_target": "belowTarget",
    "sacrificed": "sacrificed",
}


@dataclass(frozen=True, slots=True)
class PoolStats:
    """Sums over the reporting workers, and ratios weighted by what they count."""

    workers_reporting: int  # pods with a line: the snapshot values sum over them
    mode: str
    paused: int
    paused_cap: int  # summed over the workers, as are the other counts
    resident_headroom: int
    waiters: int
    at_risk: int
    completed_window: int
    pauses_window: int
    laxity_resumes: int
    victims: Mapping[str, int] = field(default_factory=dict)
    below_target_window: float | None = None
    below_target_total: float | None = None
    credit_sum: float | None = None  # per-worker credit buckets: the pool's SLO budget
    mean_laxity: float | None = None
    paused_below_target: int | None = None
    admission_target_mean_s: float | None = None
    # the replica scaler's inputs: window sums, step-weighted batch, summed TTFT histogram
    arrivals_window: int = 0
    steps_window: int = 0
    batch_mean: float | None = None
    ttft_hist: tuple[int, ...] = ()
    # pod windows behind the window sums (a pod may add none or two); None: one per worker
    windows_counted: int | None = None

    @property
    def ttft_p90(self) -> float | None:
        return ttft_histogram.quantile(self.ttft_hist, 0.9)

    @property
    def num_windows(self) -> int:
        return self.workers_reporting if self.windows_counted is None else self.windows_counted

    @property
    def num_first_tokens(self) -> int:
        return sum(self.ttft_hist)

    @property
    def victims_window(self) -> int:
        return sum(self.victims.values())

    def victim_share(self, *kinds: str) -> float:
        """Fraction of this window's victims of the given kinds (0 when there were none)."""
        total = self.victims_window
        return sum(self.victims.get(k, 0) for k in kinds) / total if total else 0.0

    def to_status(self) -> dict[str, object]:
        """``status.preemption`` in the CRD's camelCase shape, JSON-safe (no NaN/inf)."""
        return {
            "paused": self.paused,
            "cap": self.paused_cap,
            "headroom": self.resident_headroom,
            "belowTargetWindow": _rounded(self.below_target_window, 4),
            "belowTargetTotal": _rounded(self.below_target_total, 4),
            "credit": _rounded(self.credit_sum, 2),
            "victims": {
                name: self.victims.get(kind, 0) for kind, name in _STATUS_VICTIM_KEYS.items()
            },
            "victimsText": victims_text(self.victims),
            "meanLaxitySeconds": _rounded(self.mean_laxity, 3),
            "laxityResumes": self.laxity_resumes,
            "pausedBelowTarget": self.paused_below_target,
            "waiters": self.waiters,
            "atRisk": self.at_risk,
            "admissionTargetSeconds": _rounded(self.admission_target_mean_s, 3),
        }


def victims_text(victims: Mapping[str, int]) -> str:
    """``laxity:40,below_target:10,sacrificed:7`` in the stat line's order; ``-`` if none."""
    known = [k for k in VICTIM_ORDER if victims.get(k)]
    other = sorted(k for k in victims if k not in VICTIM_ORDER and victims[k])
    return ",".join(f"{k}:{victims[k]}" for k in known + other) or "-"


def _rounded(value: float | None, digits: int) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def _weighted_mean(pairs: Iterable[tuple[float | None, float]]) -> float | None:
    """Mean of the present values, weighted; ``None`` when nothing carries weight."""
    num = den = 0.0
    for value, weight in pairs:
        if value is not None and math.isfinite(value) and weight > 0:
            num += value * weight
            den += weight
    return num / den if den > 0 else None


def _present(values: Iterable[float | int | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def _sum_victims(lines: list[StatLine]) -> dict[str, int]:
    victims: dict[str, int] = {}
    for line in lines:
        for kind, count in line.victims.items():
            victims[kind] = victims.get(kind, 0) + count
    return victims


# Per-worker counts whose pool value is their sum: snapshots (each pod's newest line)...
SUMMED_SNAPSHOTS = ("paused", "paused_cap", "resident_headroom", "waiters", "at_risk")
# ...and window counts (every window counted, each once: genpool_core.windows).
SUMMED_WINDOWS = (
    "completed_window",
    "pauses_window",
    "laxity_resumes",
    "arrivals_window",
    "steps_window",
)


def _line_key(name: str) -> str:
    """The stat line spells the knobs by its keys (``cap=``, ``headroom=``)."""
    return {"paused_cap": "cap", "resident_headroom": "headroom"}.get(name, name)


def _usable(lines: Iterable[StatLine | None]) -> list[StatLine]:
    return [line for line in lines if isinstance(line, StatLine) and math.isfinite(line.t)]


def aggregate(
    lines: Iterable[StatLine | None], windows: Iterable[StatLine | None] | None = None
) -> PoolStats | None:
    """The pool's stats: snapshots from ``lines`` (one per worker, its newest), window
    counts and ratios from ``windows`` (default: the same lines, one window each).
    ``None`` if no line is usable."""
    good = _usable(lines)
    if not good:
        return None
    counted = good if windows is None else _usable(windows)
    modes = {line.mode for line in good}
    credits = _present(line.credit for line in good)
    targets = _present(line.admission_target_s for line in good)
    paused_below = [line.paused_below_target for line in good]
    return PoolStats(
        workers_reporting=len(good),
        windows_counted=len(counted),
        mode=modes.pop() if len(modes) == 1 else MIXED_MODE,
        **{name: sum(getattr(line, _line_key(name)) for line in good) for name in SUMMED_SNAPSHOTS},
        **{name: sum(getattr(line, name) for line in counted) for name in SUMMED_WINDOWS},
        victims=_sum_victims(counted),
        below_target_window=_weighted_mean(
            (line.below_target_window, line.completed_window) for line in counted
        ),
        below_target_total=_weighted_mean(
            (line.below_target_total, line.completed_total) for line in good
        ),
        credit_sum=sum(credits) if credits else None,
        # mean_laxity is a mean over the window's laxity victims: weighting by their
        # count gives the exact pooled mean.
        mean_laxity=_weighted_mean(
            (line.mean_laxity, line.victims.get("laxity", 0)) for line in counted
        ),
        paused_below_target=(
            None if all(v is None for v in paused_below) else sum(v or 0 for v in paused_below)
        ),
        admission_target_mean_s=sum(targets) / len(targets) if targets else None,
        batch_mean=_weighted_mean((line.batch_mean, line.steps_window) for line in counted),
        ttft_hist=ttft_histogram.summed(line.ttft_hist for line in counted),
    )
