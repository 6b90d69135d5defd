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
TTFT, tokens/s, failures, the mean pass time. Writes ``bench/results/chunked_prefill.json``
(``--quick``: a smoke run, to /tmp); docs/results.md explains the numbers.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.pd_report import mean_between, medians, paired, summarize
from bench.provenance import provenance
from bench.serving_load import Load, burst_run, pinned, run_setups
from genpool_core.names import WORKER_PORT

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
KEYS = ("burst_window_s", "gap_ms_burst.p50", "gap_ms_burst.p99", "gap_ms_burst.max",
        "gap_ms_outside.p50", "gap_ms_outside.p99", "gap_ms_quiet.p50", "long_ttft_s.p50",
        "long_ttft_s.max", "steady_ttft_s_burst.p50", "steady_ttft_s_burst.p99",
        "steady_ttft_s_burst.max", "tokens_per_s", "steady_tokens_per_s_burst",
        "steady_tokens_per_s_outside", "step_ms", "failed")  # fmt: skip
PAIRED = ("gap_ms_burst.p99", "gap_ms_burst.max", "long_ttft_s.p50", "burst_window_s",
          "tokens_per_s")  # fmt: skip
ORDER_PAIRED = ("steady_ttft_s_burst.p99", "steady_ttft_s_burst.max", "long_ttft_s.p50",
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


async def _measure(setup: str, load: Load, seed: int) -> dict[str, Any]:
    loadavg = os.getloadavg()[0]
    run = await burst_run([_url(setup)], {setup: _url(setup)}, load, seed)
    result: dict[str, Any] = {"setup": setup, "loadavg_1m": [loadavg, os.getloadavg()[0]]}
    result |= summarize(run.streams, run.times)
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
    if not 1 <= reps <= 10:
        parser.error("--reps 1..10")
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > CLIENT_CORE:
        os.sched_setaffinity(0, {CLIENT_CORE})  # the clients off the workers' core
    started = time.monotonic()
    procs = {name: _start(name) for name in WORKERS}
    runs = run_setups(procs, {n: _url(n) for n in procs}, tuple(WORKERS), tuple(WORKERS), reps,
                      lambda setup, rep: _measure(setup, load, seed=rep), KEYS, LOG)  # fmt: skip
    config = {"load": vars(load), "reps": reps, "worker_args": WORKER_ARGS, "workers": WORKERS,
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
