"""The demo's numbers, from what its clients saw: per-phase tables and time series.

Pure: requests in (:class:`~genpool_devcluster.demo_load.SentRequest`, offsets in
seconds from the load's start), rows and text out. A request belongs to the phase
it was sent in; tokens/s counts tokens *delivered* within a phase (each request's
tokens spread evenly between its first and last token), so a pool that falls
behind in the burst shows it there, not in the quiet phase it catches up in.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from genpool_core.quantiles import percentile
from genpool_devcluster.demo_load import CLASS_BY_NAME, CLASSES, PoolSample, SentRequest

ROWS = (
    ("requests", "requests"),
    ("failed", "failed"),
    ("p50 TTFT (s)", "ttft_p50_s"),
    ("p90 TTFT (s)", "ttft_p90_s"),
    *((f"p90 TTFT {c.name}", f"ttft_p90_s_{c.name}") for c in CLASSES),
    ("attainment", "attainment"),
    *((f"attain. {c.name}", f"attainment_{c.name}") for c in CLASSES),
    ("mean TPOT (s)", "tpot_mean_s"),
    ("tokens/s", "tokens_per_s"),
    ("replicas (max)", "replicas_max"),
    ("replicas (mean)", "replicas_mean"),
    ("paused (mean)", "paused_mean"),
)


def output_rate(sent: SentRequest) -> float | None:
    """Tokens per second after the first token; None with under two tokens."""
    tpot = sent.result.tpot_s
    return None if tpot is None else (1.0 / tpot if tpot > 0 else float("inf"))


def floor_of(sent: SentRequest, pool_tps: float) -> float:
    """The output rate a request must reach: its class's own T_i, else the pool's T."""
    own = CLASS_BY_NAME[sent.planned.klass].output_tps
    return pool_tps if own is None else own


def attainment(sent: Sequence[SentRequest], pool_tps: float) -> float | None:
    """Share of the (ok, two tokens or more) requests at or above their own floor."""
    rates = [(r, floor_of(s, pool_tps)) for s in sent if s.result.ok
             and (r := output_rate(s)) is not None]  # fmt: skip
    return sum(rate >= floor for rate, floor in rates) / len(rates) if rates else None


def ttft_p90(sent: Sequence[SentRequest]) -> float | None:
    ttfts = [s.result.ttft_s for s in sent if s.result.ok and s.result.ttft_s is not None]
    return percentile(ttfts, 90) if ttfts else None


def delivered_tokens(sent: Sequence[SentRequest], start: float, end: float) -> float:
    """Tokens delivered within [start, end), each request's spread over its stream."""
    total = 0.0
    for s in sent:
        r = s.result
        if not r.ok or r.ttft_s is None or r.tokens == 0:
            continue
        first, last = s.planned.at_s + r.ttft_s, s.planned.at_s + r.e2e_s
        if last <= first:
            total += r.tokens if start <= first < end else 0
            continue
        overlap = max(0.0, min(end, last) - max(start, first))
        total += r.tokens * overlap / (last - first)
    return total


def phase_row(
    sent: Sequence[SentRequest],
    all_sent: Sequence[SentRequest],
    bounds: tuple[float, float],
    target_tps: float,
    samples: Sequence[PoolSample],
) -> dict[str, Any]:
    """One pool's numbers for one phase (``sent``: the requests sent in it)."""
    start, end = bounds
    ok = [s for s in sent if s.result.ok]
    ttfts = [s.result.ttft_s for s in ok if s.result.ttft_s is not None]
    tpots = [t for s in ok if (t := s.result.tpot_s) is not None]
    within = [x for x in samples if start <= x.t < end]
    counts = [x.ready for x in within]
    row: dict[str, Any] = {
        "requests": len(sent),
        "failed": len(sent) - len(ok),
        "ttft_p50_s": percentile(ttfts, 50) if ttfts else None,
        "ttft_p90_s": ttft_p90(sent),
        "attainment": attainment(sent, target_tps),
        "tpot_mean_s": statistics.fmean(tpots) if tpots else None,
        "tokens_per_s": delivered_tokens(all_sent, start, end) / (end - start),
        "replicas_max": max(counts) if counts else None,
        "replicas_mean": statistics.fmean(counts) if counts else None,
        "paused_mean": statistics.fmean(x.paused for x in within) if within else None,
    }
    for klass in CLASSES:
        mine = [s for s in sent if s.planned.klass == klass.name]
        row[f"ttft_p90_s_{klass.name}"] = ttft_p90(mine)
        row[f"attainment_{klass.name}"] = attainment(mine, target_tps)
    return row


def phase_rows(
    sent: Sequence[SentRequest],
    bounds: Sequence[tuple[str, float, float]],
    target_tps: float,
    samples: Sequence[PoolSample],
) -> dict[str, dict[str, Any]]:
    """Every phase's row for one pool, keyed by phase name, in phase order."""
    return {
        name: phase_row(
            [s for s in sent if s.planned.phase == name], sent, (start, end), target_tps, samples
        )
        for name, start, end in bounds
    }


def format_table(
    pools: Mapping[str, Mapping[str, Mapping[str, Any]]], phases: Sequence[str]
) -> str:
    """Phases side by side, each with one column per pool."""
    names = list(pools)
    width = max(11, *(len(n) + 1 for n in names))
    head1 = f"{'':18}" + "".join(f"{p:^{width * len(names)}}" for p in phases)
    head2 = f"{'':18}" + "".join(f"{n:>{width}}" for _ in phases for n in names)
    lines = [head1.rstrip(), head2]
    for label, key in ROWS:
        cells = (_cell(pools[n][p].get(key), key) for p in phases for n in names)
        lines.append(f"{label:18}" + "".join(f"{c:>{width}}" for c in cells))
    return "\n".join(lines)


def _cell(value: object, key: str) -> str:
    if value is None:
        return "-"
    if key.startswith("attainment") and isinstance(value, float):
        return f"{value:.0%}"
    if isinstance(value, float):
        one_digit = ("tokens_per_s", "replicas_mean", "paused_mean")
        return f"{value:.1f}" if key in one_digit else f"{value:.3f}"
    return str(value)


def _bins(sent: Sequence[SentRequest], bin_s: float) -> dict[int, list[SentRequest]]:
    bins: dict[int, list[SentRequest]] = {}
    for s in sent:
        bins.setdefault(int(s.planned.at_s // bin_s), []).append(s)
    return dict(sorted(bins.items()))


def ttft_p90_series(sent: Sequence[SentRequest], bin_s: float) -> list[tuple[float, float]]:
    """(bin middle, p90 TTFT) over the requests sent in each ``bin_s`` window."""
    return [((i + 0.5) * bin_s, p90) for i, b in _bins(sent, bin_s).items()
            if (p90 := ttft_p90(b)) is not None]  # fmt: skip


def slo_windows(
    sent: Sequence[SentRequest], bin_s: float, ttft_p90_s: float, share: float, pool_tps: float
) -> tuple[int, int]:
    """(met, all) over the ``bin_s`` windows of arrivals: a window meets the SLO when its
    p90 TTFT is at most ``ttft_p90_s``, at least ``share`` of its requests reached their
    floor and none failed."""
    windows = list(_bins(sent, bin_s).values())
    met = sum(meets_slo(w, ttft_p90_s, share, pool_tps) for w in windows)
    return met, len(windows)


def meets_slo(
    sent: Sequence[SentRequest], ttft_p90_s: float, share: float, pool_tps: float
) -> bool:
    """None failed, p90 TTFT at most ``ttft_p90_s``, at least ``share`` at their floor."""
    p90, attained = ttft_p90(sent), attainment(sent, pool_tps)
    return (
        all(s.result.ok for s in sent)
        and p90 is not None
        and p90 <= ttft_p90_s
        and (attained is None or attained >= share)
    )


def replica_seconds(samples: Sequence[PoolSample], end_s: float) -> float:
    """The pods' time over [0, end_s): each sample's count holds until the next one."""
    ends = [min(after.t, end_s) for after in samples[1:]] + [end_s] if samples else []
    return sum(
        here.pods * max(0.0, until - max(here.t, 0.0))
        for here, until in zip(samples, ends, strict=True)
    )


def format_events(events: Sequence[Mapping[str, Any]], reasons: Sequence[str]) -> list[str]:
    """The Events whose reason is in ``reasons``, oldest first, one line each."""
    chosen = [e for e in events if e.get("reason") in reasons]
    chosen.sort(key=_event_time)
    return [f"{_event_time(e)}  {e.get('reason', ''):<11} {e.get('message', '')}" for e in chosen]


def _event_time(event: Mapping[str, Any]) -> str:
    stamp = event.get("lastTimestamp") or event.get("eventTime") or ""
    return str(stamp)


def format_inputs(scaling: Mapping[str, Any], pinned: float | None = None) -> str:
    """The scaler's latest inputs (``status.scaling.inputs``) in one line: what its last
    decision read. ``pinned``: the pool's targetUtilization (the capacity is then fixed,
    not learned)."""
    inputs = scaling.get("inputs")
    if not isinstance(inputs, Mapping) or not inputs:
        return "scaler inputs: none yet (no round has decided on a window)"
    source = "learned" if pinned is None else f"pinned by targetUtilization {pinned:g}"
    budget = inputs.get("pauseBudget")
    return (
        f"scaler inputs ({scaling.get('reason', '-')}): forecast "
        f"{_rate(inputs.get('forecast'))} req/s, {_rate(inputs.get('capacityPerReplica'))} req/s"
        f" per replica (capacity {_rate(inputs.get('capacity'))}, {source}), tail "
        f"{_rate(inputs.get('tail'))}, pause budget {'off' if budget is None else budget}, "
        f"backlog {inputs.get('backlog', '-')}"
    )


def _rate(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-"
    return f"{value:.2f}"
