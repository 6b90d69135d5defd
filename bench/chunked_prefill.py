"""Chunked prefill on one CPU core: decode gaps while a burst of 2k-token prompts arrives.

    .venv/bin/python -m bench.chunked_prefill [--quick] [--reps 3]

Four real ``genpool-worker --role both`` processes (SmolLM2-135M, CPU,
``OMP_NUM_THREADS=1``), all pinned to core 0, differing only in the per-pass prefill
budget (``--max-prefill-tokens-per-pass``): ``whole`` (0: each prompt prefilled in the
pass that admits it), ``chunk512`` and ``chunk128`` (the default off CUDA), and in who
gets it: ``chunk128-arrival`` serves the chunks oldest first (``--prefill-order
arrival``), the others by risk (the default). The bench's own
clients run on core 1. Runs alternate the setups (the idle workers wait). Each run:
4 closed-loop streaming clients (short prompts, 64 tokens, greedy) and, after a warm-up
and a quiet window, 4 prompts of 2000 tokens (8 tokens each) sent at once. Measured: the
steady streams' inter-token gaps (decode TPOT as a client sees it) inside the burst
window (burst start to the last long prompt's end) and outside it, the long prompts'
TTFT, tokens/s, failures, the mean pass time; and probes: short prompts (``PROBE_TOKENS``
each, on a client of their own) sent at set moments after the burst is due
(``PROBE_OFFSETS_S``), while the long prompts' chunks are queued, so their TTFT is what
the prefill order decides (a closed-loop client's next request may or may not land
there). Writes ``bench/results/chunked_prefill.json`` (``--quick``: a smoke run, to
/tmp); docs/results.md explains the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.pd_report import Stream, mean_between, medians, paired, summarize
from bench.provenance import provenance
from bench.serving_load import (
    STEADY_PROMPTS,
    Load,
    burst_run,
    client,
    one_stream,
    pinned,
    run_setups,
)
from genpool_core.names import WORKER_PORT
from genpool_core.quantiles import percentile

RESULTS = Path(__file__).resolve().parent / "results" / "chunked_prefill.json"
QUICK_RESULTS = Path("/tmp/genpool-bench-chunked-prefill-quick.json")
LOG = "/tmp/genpool-bench-chunked-{name}.log"
WORKER_CORE, CLIENT_CORE = 0, 1
# setup -> (host, per-pass prefill budget, prefill order); outside the pod runner's 127.0/16.
WORKERS: dict[str, tuple[str, int, str]] = {
    "whole": ("127.1.0.31", 0, "risk"),
    "chunk512": ("127.1.0.32", 512, "risk"),
    "chunk128": ("127.1.0.33", 128, "risk"),
    "chunk128-arrival": ("127.1.0.34", 128, "arrival"),
}
BASELINE = "whole"
WORKER_ARGS = ("--max-batch-size", "12", "--max-seq-len", "2304", "--stat-interval-s", "30")
LOAD = Load(clients=4, steady_tokens=64, long_prompts=4, long_tokens=2000, long_max_tokens=8,
            warmup_s=3.0, quiet_s=5.0, after_s=3.0)  # fmt: skip
QUICK = Load(clients=2, steady_tokens=16, long_prompts=2, long_tokens=512, warmup_s=2.0,
             quiet_s=2.0, after_s=1.0)  # fmt: skip
PROBE_OFFSETS_S = (0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0)  # after the burst is due
QUICK_PROBE_OFFSETS_S = (0.3, 0.6)
PROBE_TOKENS = 4
KEYS = ("probe_ttft_s.p50", "probe_ttft_s.p90", "probe_ttft_s.max", "burst_window_s",
        "gap_ms_burst.p50", "gap_ms_burst.p99", "gap_ms_burst.max",
        "gap_ms_outside.p50", "gap_ms_outside.p99", "gap_ms_quiet.p50", "long_ttft_s.p50",
        "long_ttft_s.max", "steady_ttft_s_burst.p50", "steady_ttft_s_burst.p99",
        "steady_ttft_s_burst.max", "tokens_per_s", "steady_tokens_per_s_burst",
        "steady_tokens_per_s_outside", "step_ms", "failed")  # fmt: skip
PAIRED = ("gap_ms_burst.p99", "gap_ms_burst.max", "long_ttft_s.p50", "burst_window_s",
          "tokens_per_s")  # fmt: skip
ORDER_PAIRED = ("probe_ttft_s.p90", "probe_ttft_s.max", "steady_ttft_s_burst.p99",
                "steady_ttft_s_burst.max", "long_ttft_s.p50",
                "long_ttft_s.max", "burst_window_s", "gap_ms_burst.p99")  # fmt: skip


def _url(name: str) -> str:
    return f"http://{WORKERS[name][0]}:{WORKER_PORT}"


def _start(name: str) -> subprocess.Popen[bytes]:
    host, budget, order = WORKERS[name]
    cmd = [sys.executable, "-m", "genpool_worker.worker_cli", "--model", "smollm2-135m",
           "--host", host, "--port", str(WORKER_PORT), *WORKER_ARGS,
           "--max-prefill-tokens-per-pass", str(budget), "--prefill-order", order]  # fmt: skip
    with Path(LOG.format(name=name)).open("wb") as log:  # the worker's own log
        return pinned(cmd, WORKER_CORE, stdout=log, stderr=subprocess.STDOUT)


async def _probes(url: str, due: float, offsets: tuple[float, ...]) -> list[Stream]:
    """A short prompt at each of ``offsets`` seconds after ``due`` (monotonic)."""
    probe_client = client(url)

    async def one(index: int, offset: float) -> Stream:
        await asyncio.sleep(max(0.0, due + offset - time.monotonic()))
        prompt = STEADY_PROMPTS[index % len(STEADY_PROMPTS)]
        return await one_stream(probe_client, "probe", prompt, PROBE_TOKENS)

    streams = await asyncio.gather(*(one(i, o) for i, o in enumerate(offsets)))
    await probe_client.close()
    return list(streams)


def _probe_stats(probes: list[Stream], times: dict[str, float]) -> dict[str, Any]:
    """The probes sent inside the burst window: their TTFT (s) and when they went."""
    inside = [p for p in probes if p.chunks and times["tb"] <= p.sent < times["te"]]
    ttfts = [p.chunks[0] - p.sent for p in inside]
    stats = {f"p{q}": round(percentile(ttfts, q), 2) for q in (50, 90)} if ttfts else {}
    return {"probe_ttft_s": {"n": len(ttfts), **stats, "max": round(max(ttfts, default=0), 2),
                             "sent_after_burst_s": [round(p.sent - times["tb"], 2)
                                                    for p in inside]},
            "probe_failed": sum(p.error is not None for p in probes)}  # fmt: skip


async def _measure(setup: str, load: Load, seed: int, offsets: tuple[float, ...]) -> dict[str, Any]:
    loadavg = os.getloadavg()[0]
    due = time.monotonic() + load.warmup_s + load.quiet_s  # when burst_run sends the burst
    run, probes = await asyncio.gather(
        burst_run([_url(setup)], {setup: _url(setup)}, load, seed),
        _probes(_url(setup), due, offsets),
    )
    result: dict[str, Any] = {"setup": setup, "loadavg_1m": [loadavg, os.getloadavg()[0]]}
    result |= summarize(run.streams, run.times) | _probe_stats(probes, run.times)
    before, after = run.scrapes["t0"][setup], run.scrapes["t1"][setup]
    result["step_ms"] = mean_between(before, after, "genpool_step_seconds", 1e3)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chunked_prefill", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke run: small, 1 repetition")
    parser.add_argument("--reps", type=int, default=None, help="runs per setup (default 3)")
    args = parser.parse_args(argv)
    source = provenance("bench.chunked_prefill", argv)  # what the workers run: the tree at start
    load, reps = (QUICK, args.reps or 1) if args.quick else (LOAD, args.reps or 3)
    offsets = QUICK_PROBE_OFFSETS_S if args.quick else PROBE_OFFSETS_S
    if not 1 <= reps <= 10:
        parser.error("--reps 1..10")
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > CLIENT_CORE:
        os.sched_setaffinity(0, {CLIENT_CORE})  # the clients off the workers' core
    started = time.monotonic()
    procs = {name: _start(name) for name in WORKERS}
    runs = run_setups(procs, {n: _url(n) for n in procs}, tuple(WORKERS), tuple(WORKERS), reps,
                      lambda name, rep: _measure(name, load, rep, offsets), KEYS, LOG)  # fmt: skip
    config = {"load": vars(load), "probe_offsets_s": offsets, "probe_tokens": PROBE_TOKENS,
              "reps": reps, "worker_args": WORKER_ARGS, "workers": WORKERS,
              "worker_core": WORKER_CORE, "client_core": CLIENT_CORE,
              "taskset": shutil.which("taskset") is not None, "cpus": os.cpu_count(),
              "wall_s": round(time.monotonic() - started, 1)}  # fmt: skip
    table = medians(runs, WORKERS, KEYS)
    ratios = {f"{setup}/{BASELINE}": {key: paired(runs, key, setup, BASELINE) for key in PAIRED}
              for setup in WORKERS if setup != BASELINE}  # fmt: skip
    ratios["chunk128/chunk128-arrival"] = {  # prefill by risk over oldest first
        key: paired(runs, key, "chunk128", "chunk128-arrival") for key in ORDER_PAIRED
    }
    result = {**source, "config": config, "runs": runs,
              "medians": table, "paired": ratios}  # fmt: skip
    path = QUICK_RESULTS if args.quick else RESULTS
    path.write_text(json.dumps(result, indent=2) + "\n")
    for setup, key in itertools.product(WORKERS, KEYS):
        if (cell := table[setup].get(key)) is not None:
            print(f"{setup:9} {key:30} {cell['median']:>12} {cell['runs']}")
    for name, by_key in ratios.items():
        print(name, json.dumps({k: v["median"] for k, v in by_key.items()}))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
