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
from genpool_devcluster.demo_load import SentRequest

ReplicaSample = tuple[float, int]  # (offset s, ready worker pods)

ROWS = (
    ("requests", "requests"),
    ("failed", "failed"),
    ("p50 TTFT (s)", "ttft_p50_s"),
    ("p90 TTFT (s)", "ttft_p90_s"),
    ("attainment at T", "attainment"),
    ("mean TPOT (s)", "tpot_mean_s"),
    ("tokens/s", "tokens_per_s"),
    ("replicas (max)", "replicas_max"),
    ("replicas (mean)", "replicas_mean"),
)


def output_rate(sent: SentRequest) -> float | None:
    """Tokens per second after the first token; None with under two tokens."""
    tpot = sent.result.tpot_s
    return None if tpot is None else (1.0 / tpot if tpot > 0 else float("inf"))


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
    replicas: Sequence[ReplicaSample],
) -> dict[str, Any]:
    """One pool's numbers for one phase (``sent``: the requests sent in it)."""
    start, end = bounds
    ok = [s for s in sent if s.result.ok]
    ttfts = [s.result.ttft_s for s in ok if s.result.ttft_s is not None]
    tpots = [t for s in ok if (t := s.result.tpot_s) is not None]
    rates = [rate for s in ok if (rate := output_rate(s)) is not None]
    counts = [n for t, n in replicas if start <= t < end]
    return {
        "requests": len(sent),
        "failed": len(sent) - len(ok),
        "ttft_p50_s": percentile(ttfts, 50) if ttfts else None,
        "ttft_p90_s": percentile(ttfts, 90) if ttfts else None,
        "attainment": sum(rate >= target_tps for rate in rates) / len(rates) if rates else None,
        "tpot_mean_s": statistics.fmean(tpots) if tpots else None,
        "tokens_per_s": delivered_tokens(all_sent, start, end) / (end - start),
        "replicas_max": max(counts) if counts else None,
        "replicas_mean": statistics.fmean(counts) if counts else None,
    }


def phase_rows(
    sent: Sequence[SentRequest],
    bounds: Sequence[tuple[str, float, float]],
    target_tps: float,
    replicas: Sequence[ReplicaSample],
) -> dict[str, dict[str, Any]]:
    """Every phase's row for one pool, keyed by phase name, in phase order."""
    return {
        name: phase_row(
            [s for s in sent if s.planned.phase == name], sent, (start, end), target_tps, replicas
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
    if key == "attainment" and isinstance(value, float):
        return f"{value:.0%}"
    if isinstance(value, float):
        return f"{value:.1f}" if key in ("tokens_per_s", "replicas_mean") else f"{value:.3f}"
    return str(value)


def ttft_p90_series(sent: Sequence[SentRequest], bin_s: float) -> list[tuple[float, float]]:
    """(bin middle, p90 TTFT) over the requests sent in each ``bin_s`` window."""
    bins: dict[int, list[float]] = {}
    for s in sent:
        if s.result.ok and s.result.ttft_s is not None:
            bins.setdefault(int(s.planned.at_s // bin_s), []).append(s.result.ttft_s)
    return [((i + 0.5) * bin_s, percentile(v, 90)) for i, v in sorted(bins.items())]


def format_events(events: Sequence[Mapping[str, Any]], reasons: Sequence[str]) -> list[str]:
    """The Events whose reason is in ``reasons``, oldest first, one line each."""
    chosen = [e for e in events if e.get("reason") in reasons]
    chosen.sort(key=_event_time)
    return [f"{_event_time(e)}  {e.get('reason', ''):<11} {e.get('message', '')}" for e in chosen]


def _event_time(event: Mapping[str, Any]) -> str:
    stamp = event.get("lastTimestamp") or event.get("eventTime") or ""
    return str(stamp)
