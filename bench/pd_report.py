"""The P/D bench's arithmetic (``bench.pd``): one run's gaps, TTFTs and throughput from
its streams, the decode worker's TTFT parts and pulls over the burst window, and the
medians and paired ratios over runs. Pure: no processes, no HTTP."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from genpool_core.quantiles import percentile

BLOCK_BYTES = 16 * 30 * 2 * 3 * 64 * 4  # SmolLM2: block size x layers x K,V x heads x dim x fp32
FAILED_PULLS = 'genpool_kv_transfers_total{outcome="failed",side="import"}'
# Where the clients send: whole prefills colocated, chunked (128 a pass) colocated, P/D.
SETUPS = {"colocated": ("both0", "both1"), "colocated-chunked": ("chunk0", "chunk1"),
          "pd": ("decode",)}  # fmt: skip
PARTS = ("prefill_queue", "prefill", "handoff", "transfer", "gen_wait")


@dataclass
class Stream:
    kind: str  # steady | long
    sent: float
    chunks: list[float] = field(default_factory=list)  # arrival of each text chunk
    tokens: int = 0
    error: str | None = None


def mean_between(before: dict[str, float], after: dict[str, float], histogram: str,
          scale: float = 1.0) -> float | None:  # fmt: skip
    """A histogram's mean observation between two scrapes; ``histogram`` may carry labels."""
    name, brace, labels = histogram.partition("{")
    keys = (f"{name}_{s}{brace}{labels}" for s in ("count", "sum"))
    count, total = (after.get(k, 0.0) - before.get(k, 0.0) for k in keys)
    return round(total / count * scale, 4) if count else None


def _stats(values: list[float], scale: float = 1e3, digits: int = 1) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {"n": len(values), "p50": round(percentile(values, 50) * scale, digits),
            "p99": round(percentile(values, 99) * scale, digits),
            "max": round(max(values) * scale, digits)}  # fmt: skip


def summarize(streams: list[Stream], t: dict[str, float]) -> dict[str, Any]:
    """Steady streams' gaps in and out of the burst window [tb, te] and around the long
    prompts' first tokens (P/D's pulls and KV copies), TTFTs, tokens/s."""
    longs = [s for s in streams if s.kind == "long"]
    firsts = [s.chunks[0] for s in longs if s.chunks] or [t["te"]]
    near_from, near_to = min(firsts) - 0.5, max(firsts) + 0.5
    gaps: dict[str, list[float]] = {"burst": [], "outside": [], "quiet": [], "handoff": []}
    ttfts: dict[bool, list[float]] = {True: [], False: []}
    for s in (s for s in streams if s.kind == "steady"):
        for a, b in itertools.pairwise(s.chunks):
            if b > t["tb"] and a < t["te"]:
                gaps["burst"].append(b - a)
            elif a >= t["t0"] and b <= t["t1"]:
                gaps["outside"].append(b - a)
                if b <= t["tb"]:  # before the burst only
                    gaps["quiet"].append(b - a)
            if b > near_from and a < near_to:
                gaps["handoff"].append(b - a)
        if s.chunks and s.sent >= t["t0"]:
            ttfts[t["tb"] <= s.sent < t["te"]].append(s.chunks[0] - s.sent)
    steady = [c for s in streams if s.kind == "steady" for c in s.chunks if t["t0"] <= c <= t["t1"]]
    in_burst = sum(t["tb"] <= c <= t["te"] for c in steady)
    burst_s = t["te"] - t["tb"]
    return {
        "burst_window_s": round(burst_s, 2),
        **{f"gap_ms_{k}": _stats(v) for k, v in gaps.items()},
        "steady_ttft_s_burst": _stats(ttfts[True], 1, 2),
        "steady_ttft_s_outside": _stats(ttfts[False], 1, 2),
        "long_ttft_s": _stats([s.chunks[0] - s.sent for s in longs if s.chunks], 1, 2),
        "tokens_per_s": round(sum(t["t0"] <= c <= t["t1"] for s in streams for c in s.chunks)
                              / (t["t1"] - t["t0"]), 2),
        "steady_tokens_per_s_burst": round(in_burst / burst_s, 2),
        "steady_tokens_per_s_outside": round((len(steady) - in_burst)
                                             / (t["t1"] - t["t0"] - burst_s), 2),
        "chunks_per_token": round(sum(len(s.chunks) for s in streams)
                                  / max(1, sum(s.tokens for s in streams)), 3),
        "requests": len(streams),
        "failed": sum(s.error is not None for s in streams),
        "errors": sorted({s.error for s in streams if s.error})[:5],
    }  # fmt: skip


def pd_window(d0: dict[str, float], d1: dict[str, float], p0: dict[str, float],
              p1: dict[str, float]) -> dict[str, Any]:  # fmt: skip
    """The decode worker's TTFT parts and KV pulls between two scrapes (and the prefill
    worker's exports): every request pulled in the window, steady ones included."""

    def delta(new: dict[str, float], old: dict[str, float], key: str) -> float:
        return new.get(key, 0.0) - old.get(key, 0.0)

    nbytes = delta(d1, d0, 'genpool_kv_transfer_bytes_total{side="import"}')
    pulls = delta(d1, d0, 'genpool_kv_transfers_total{outcome="ok",side="import"}')
    pull_s = delta(d1, d0, "genpool_kv_transfer_seconds_sum")
    blocks = nbytes / BLOCK_BYTES
    return {
        "ttft_parts_mean_s": {p: mean_between(d0, d1, f'genpool_pd_ttft_part_seconds{{part="{p}"}}')
                              for p in PARTS},
        "pulls": int(pulls),
        "pull_failed": int(delta(d1, d0, FAILED_PULLS)),
        "fallbacks": {k: v - d0.get(k, 0.0) for k, v in d1.items()
                      if k.startswith("genpool_kv_transfer_fallbacks") and v > d0.get(k, 0.0)},
        "blocks": round(blocks, 1),
        "bytes_per_pull": round(nbytes / pulls) if pulls else None,
        "bytes_per_block": round(nbytes / blocks) if blocks else None,
        "pull_ms_per_pull": round(pull_s / pulls * 1e3, 2) if pulls else None,
        "pull_ms_per_block": round(pull_s / blocks * 1e3, 3) if blocks else None,
        "pull_mb_per_s": round(nbytes / pull_s / 1e6, 1) if pull_s else None,
        "export_bytes": int(delta(p1, p0, 'genpool_kv_transfer_bytes_total{side="export"}')),
    }  # fmt: skip


KEYS = ("burst_window_s", "gap_ms_burst.p50", "gap_ms_burst.p99", "gap_ms_burst.max",
        "gap_ms_outside.p50", "gap_ms_outside.p99", "gap_ms_quiet.p50", "gap_ms_handoff.max",
        "long_ttft_s.p50", "long_ttft_s.max", "steady_ttft_s_burst.max", "tokens_per_s",
        "steady_tokens_per_s_burst", "steady_tokens_per_s_outside", "failed",
        *(f"pd_burst.ttft_parts_mean_s.{p}" for p in PARTS), "pd_burst.pulls",
        "pd_burst.bytes_per_pull", "pd_burst.pull_ms_per_pull", "pd_burst.pull_ms_per_block",
        "pd_burst.pull_mb_per_s")  # fmt: skip


def value_at(run: dict[str, Any], key: str) -> float | None:
    value: Any = run
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value if isinstance(value, int | float) else None


def medians(runs: list[dict[str, Any]], setups: Iterable[str] = SETUPS,
            keys: Iterable[str] = KEYS) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Per setup and key: the median over its runs, and each run's value (the spread)."""
    out: dict[str, dict[str, Any]] = {setup: {} for setup in setups}
    for setup, key in itertools.product(out, keys):
        values = [v for r in runs if r["setup"] == setup if (v := value_at(r, key)) is not None]
        if values:
            out[setup][key] = {"median": round(statistics.median(values), 4), "runs": values}
    return out


def paired(runs: list[dict[str, Any]], key: str = "gap_ms_burst.p99", setup: str = "pd",
           baseline: str = "colocated") -> dict[str, Any]:  # fmt: skip
    """``setup`` over ``baseline`` within each repetition (back-to-back runs share the
    machine): the per-repetition ratios of ``key`` and their median."""
    ratios = []
    for rep in sorted({r["rep"] for r in runs}):
        pair = {r["setup"]: value_at(r, key) for r in runs if r["rep"] == rep}
        value, base = pair.get(setup), pair.get(baseline)
        if value is not None and base:
            ratios.append(round(value / base, 4))
    median = round(statistics.median(ratios), 4) if ratios else None
    return {"key": key, "per_rep": ratios, "median": median}
