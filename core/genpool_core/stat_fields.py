"""The stat line's fields (docs/design.md#stat-line): one row each, the one definition.

A row names a field's line key (``cap=``), the ``StatLine`` attribute(s) behind it
(two for an ``a/b`` pair: window, total), how its value is written, when the line
shows it, whether a line without it is no stat line, and how the pool's value is made
from the workers' lines (the ``PoolStats`` attribute, its rule and its key in
``status.preemption``). ``statline`` formats and parses by these rows, ``aggregate``
pools by them; rows are in the order the line prints them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Kind(Enum):
    """How a value is written on the line; ``-`` stands for a missing one."""

    TEXT = "text"  # as is (the mode)
    INT = "int"  # a count, never negative
    OPT_INT = "opt_int"  # a count or ``-``
    FLOAT = "float"  # finite, printed with ``digits`` decimals, or ``-``
    FLOAT_PAIR = "float_pair"  # ``window/total``: two FLOATs
    INT_PAIR = "int_pair"  # ``window/total``: two INTs
    VICTIMS = "victims"  # ``kind:count,...`` in VICTIM_ORDER, ``-`` when none
    HISTOGRAM = "histogram"  # ttft_histogram.format_sparse


class Shown(Enum):
    """When the line carries a field (a parser reads it whenever it is there)."""

    ALWAYS = "always"
    SLO = "slo"  # in the target_output_tps mode
    TPOT = "tpot"  # in the tpot_budget mode
    # in the target_output_tps mode; in the others once its total is set (requests
    # with their own floor T_i)
    SLO_OR_SET = "slo_or_set"
    ARRIVALS = "arrivals"  # once the worker has seen a request (arrivals total > 0)
    SET = "set"  # when it has a value (KV use: a worker with a KV budget)
    # (SLO_OR_SET and SET: a count pair is set once its total is above 0)


class Over(Enum):
    """Which lines a pool value is made from."""

    SNAPSHOTS = "snapshots"  # each worker's newest line
    WINDOWS = "windows"  # every window counted, each once (genpool_core.windows)


class Rule(Enum):
    """How the workers' values make the pool's."""

    SAME = "same"  # the value they all share, else aggregate.MIXED_MODE
    SUM = "sum"  # counts, victim maps and histograms add up
    SUM_PRESENT = "sum_present"  # the sum of those that have one; None if none does
    MEAN_PRESENT = "mean_present"  # the plain mean of those that have one
    WEIGHTED_MEAN = "weighted_mean"  # a ratio, weighted by the count it was measured over


class StatusGroup(Enum):
    """``status.preemption`` lists its keys group by group, in this order."""

    KNOBS = "knobs"  # the knobs and what they hold
    OUTCOMES = "outcomes"  # what preemption did
    QUEUE = "queue"  # the admission queue


@dataclass(frozen=True, slots=True)
class Weight:
    """The count a ratio was measured over: a ``StatLine`` attribute, or with ``key``
    that entry of a map attribute (the window's laxity victims); ``fallback``: the
    attribute a line from an older worker, without ``attr``, is weighted by instead."""

    attr: str
    key: str | None = None
    fallback: str | None = None


@dataclass(frozen=True, slots=True)
class Status:
    """A pool value's key in ``status.preemption`` (floats rounded to ``digits``)."""

    key: str
    group: StatusGroup
    digits: int | None = None


@dataclass(frozen=True, slots=True)
class Pool:
    """How one ``StatLine`` attribute becomes the ``PoolStats`` attribute ``attr``."""

    attr: str
    rule: Rule
    over: Over
    weight: Weight | None = None  # WEIGHTED_MEAN only
    status: Status | None = None


@dataclass(frozen=True, slots=True)
class StatField:
    key: str  # the line key: ``cap`` in ``cap=12``
    attrs: tuple[str, ...]  # the StatLine attribute, or (window, total) for a pair
    kind: Kind
    digits: int | None = None  # FLOAT kinds: decimals printed
    shown: Shown = Shown.ALWAYS
    required: bool = False  # a line without it (or with ``-``) is no stat line
    pools: tuple[Pool | None, ...] = ()  # per attribute; () when none is pooled
    derived: bool = False  # printed for people from other fields, never parsed

    @property
    def is_pair(self) -> bool:
        return self.kind in (Kind.FLOAT_PAIR, Kind.INT_PAIR)


def _sum(
    attr: str, over: Over, status: str | None = None, group: StatusGroup = StatusGroup.KNOBS
) -> Pool:
    """A summed count, in ``status.preemption`` under ``status`` when it is given."""
    return Pool(attr, Rule.SUM, over, status=None if status is None else Status(status, group))


_S, _W = Over.SNAPSHOTS, Over.WINDOWS
_KNOBS, _OUTCOMES, _QUEUE = StatusGroup.KNOBS, StatusGroup.OUTCOMES, StatusGroup.QUEUE

# A window is known by its end ``t`` as printed: two windows are told apart only if their
# ends are farther apart than this, so no stat interval may be shorter.
T_DIGITS = 1
MIN_STAT_INTERVAL_S = 10.0**-T_DIGITS

FIELDS: tuple[StatField, ...] = (
    StatField("t", ("t",), Kind.FLOAT, T_DIGITS, required=True),
    StatField("mode", ("mode",), Kind.TEXT, required=True,
              pools=(Pool("mode", Rule.SAME, _S),)),
    StatField("T", ("target_output_tps",), Kind.FLOAT, 2, Shown.SLO),
    StatField("budget", ("tpot_budget",), Kind.FLOAT, 3, Shown.TPOT),
    StatField("window", ("window_s",), Kind.FLOAT, 3, Shown.TPOT),
    StatField("inflation", ("inflation",), Kind.FLOAT, 3, Shown.TPOT),
    StatField("residents", ("residents",), Kind.INT, required=True),
    StatField("active", ("active",), Kind.INT, required=True),
    StatField("paused", ("paused",), Kind.INT, required=True,
              pools=(_sum("paused", _S, "paused"),)),
    StatField("cap", ("cap",), Kind.INT, required=True,
              pools=(_sum("paused_cap", _S, "cap"),)),
    StatField("headroom", ("headroom",), Kind.INT, required=True,
              pools=(_sum("resident_headroom", _S, "headroom"),)),
    # KV blocks held / the worker's blocks, and the paused residents' share of them
    StatField("kv", ("kv_used",), Kind.FLOAT, 3, Shown.SET,
              pools=(Pool("kv_used", Rule.MEAN_PRESENT, _S,
                          status=Status("kvUsage", _KNOBS, 3)),)),
    StatField("kv_paused", ("kv_paused",), Kind.FLOAT, 3, Shown.SET,
              pools=(Pool("kv_paused", Rule.MEAN_PRESENT, _S,
                          status=Status("kvPausedShare", _KNOBS, 3)),)),
    # at-risk waiters pausing could still admit now (the scaler's "budget left")
    StatField("pause_budget", ("pause_budget",), Kind.OPT_INT, shown=Shown.SET,
              pools=(Pool("pause_budget", Rule.SUM_PRESENT, _S,
                          status=Status("pauseBudget", _KNOBS)),)),
    StatField("waiters", ("waiters",), Kind.INT, required=True,
              pools=(_sum("waiters", _S, "waiters", _QUEUE),)),
    StatField("at_risk", ("at_risk",), Kind.INT,
              pools=(_sum("at_risk", _S, "atRisk", _QUEUE),)),
    StatField("X", ("admission_target_s",), Kind.FLOAT, 2,
              pools=(Pool("admission_target_mean_s", Rule.MEAN_PRESENT, _S,
                          status=Status("admissionTargetSeconds", _QUEUE, 3)),)),
    StatField("below_target", ("below_target_window", "below_target_total"), Kind.FLOAT_PAIR,
              3, Shown.SLO_OR_SET,
              pools=(Pool("below_target_window", Rule.WEIGHTED_MEAN, _W,
                          # older workers' lines lack slo_completed: all completions
                          Weight("slo_completed_window", fallback="completed_window"),
                          Status("belowTargetWindow", _OUTCOMES, 4)),
                     Pool("below_target_total", Rule.WEIGHTED_MEAN, _S,
                          Weight("slo_completed_total", fallback="completed_total"),
                          Status("belowTargetTotal", _OUTCOMES, 4)))),
    StatField("credit", ("credit",), Kind.FLOAT, 2, Shown.SLO,
              pools=(Pool("credit_sum", Rule.SUM_PRESENT, _S,
                          status=Status("credit", _OUTCOMES, 2)),)),
    StatField("victims", ("victims",), Kind.VICTIMS,
              pools=(_sum("victims", _W, "victims", _OUTCOMES),)),
    StatField("mean_laxity", ("mean_laxity",), Kind.FLOAT, 2, Shown.SLO,
              pools=(Pool("mean_laxity", Rule.WEIGHTED_MEAN, _W,
                          # a mean over the window's laxity victims: weighting by their
                          # count gives the exact pooled mean
                          Weight("victims", "laxity"),
                          Status("meanLaxitySeconds", _OUTCOMES, 3)),)),
    StatField("laxity_resumes", ("laxity_resumes",), Kind.INT, shown=Shown.SLO,
              pools=(_sum("laxity_resumes", _W, "laxityResumes", _OUTCOMES),)),
    StatField("forced_resumes", ("forced_resumes",), Kind.INT),
    StatField("paused_below_target", ("paused_below_target",), Kind.OPT_INT, shown=Shown.SLO,
              pools=(Pool("paused_below_target", Rule.SUM_PRESENT, _S,
                          status=Status("pausedBelowTarget", _OUTCOMES)),)),
    StatField("completed", ("completed_window", "completed_total"), Kind.INT_PAIR,
              pools=(_sum("completed_window", _W), None)),
    # the completions below_target is over (keyed, counted against a floor): its weight
    StatField("slo_completed", ("slo_completed_window", "slo_completed_total"), Kind.INT_PAIR,
              shown=Shown.SLO_OR_SET, pools=(_sum("slo_completed_window", _W), None)),
    StatField("pauses", ("pauses_window", "pauses_total"), Kind.INT_PAIR,
              pools=(_sum("pauses_window", _W), None)),
    # the replica scaler's inputs: load and GEN TTFT over the window
    StatField("arrivals", ("arrivals_window", "arrivals_total"), Kind.INT_PAIR,
              shown=Shown.ARRIVALS, pools=(_sum("arrivals_window", _W), None)),
    StatField("steps", ("steps_window",), Kind.INT, shown=Shown.ARRIVALS,
              pools=(_sum("steps_window", _W),)),
    StatField("batch", ("batch_mean",), Kind.FLOAT, 2, Shown.ARRIVALS,
              pools=(Pool("batch_mean", Rule.WEIGHTED_MEAN, _W, Weight("steps_window")),)),
    # batch size x pass seconds over the window: decode position-seconds
    StatField("batch_s", ("batch_seconds",), Kind.FLOAT, 1, Shown.ARRIVALS,
              pools=(Pool("batch_seconds", Rule.SUM_PRESENT, _W),)),
    # speculative decoding: drafted tokens verified and those emitted (their ratio over a
    # window is its acceptance rate)
    StatField("drafted", ("drafted_window", "drafted_total"), Kind.INT_PAIR, shown=Shown.SET),
    StatField("accepted", ("accepted_window", "accepted_total"), Kind.INT_PAIR,
              shown=Shown.SET),
    # for people; parsers read the histogram
    StatField("ttft_p90", ("ttft_p90",), Kind.FLOAT, 3, Shown.ARRIVALS, derived=True),
    StatField("ttft_hist", ("ttft_hist",), Kind.HISTOGRAM, shown=Shown.ARRIVALS,
              pools=(_sum("ttft_hist", _W),)),
)  # fmt: skip

REQUIRED_KEYS: tuple[str, ...] = tuple(f.key for f in FIELDS if f.required)


def pooled(fields: tuple[StatField, ...] = FIELDS) -> list[tuple[StatField, str, Pool]]:
    """``(row, StatLine attribute, its pool rule)`` for every pooled attribute."""
    return [
        (row, attr, pool)
        for row in fields
        for attr, pool in zip(row.attrs, row.pools or (None,) * len(row.attrs), strict=True)
        if pool is not None
    ]
