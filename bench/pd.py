"""Prefill/decode disaggregation on 2 CPU cores: colocated vs P/D under a long-prompt burst.

    .venv/bin/python -m bench.pd [--quick] [--reps 3]

Six real ``genpool-worker`` processes (SmolLM2-135M, CPU, ``OMP_NUM_THREADS=1``), each
pinned to one core: ``colocated`` = two ``--role both`` workers (cores 0, 1), requests
round robin, whole prefills; ``colocated-chunked`` = the same with 128 prefill tokens a
pass (the worker's default off CUDA); ``pd`` = a ``--role prefill`` worker (core 0) and
a ``--role decode --prefillers <it>`` worker (core 1) that takes every request. Runs
alternate the setups (the idle ones wait). Each run: 4 closed-loop streaming clients
(short prompts, 64 tokens, greedy) and, after a warm-up and a quiet window, 6 prompts of
1024 tokens (8 tokens each) sent at once. Measured: the steady streams' inter-token gaps
inside the burst window (burst start to the last long prompt's end) and outside it,
TTFTs, tokens/s, failures; for P/D the decode worker's TTFT parts and KV pulls over the
burst window. A matmul probe first measures what one core does alone and with the other
busy. Writes ``bench/results/pd.json`` (``--quick``: a smoke run, to /tmp);
docs/results.md explains the numbers.
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

from bench.pd_report import (
    KEYS,
    SETUPS,
    mean_between,
    medians,
    paired,
    pd_window,
    summarize,
)
from bench.provenance import provenance
from bench.serving_load import Load, burst_run, pinned, run_setups
from genpool_core.names import WORKER_PORT

RESULTS = Path(__file__).resolve().parent / "results" / "pd.json"
QUICK_RESULTS = Path("/tmp/genpool-bench-pd-quick.json")
LOG = "/tmp/genpool-bench-pd-{name}.log"
# name -> (host, core, role); outside the pod runner's 127.0/16 (a dev cluster may run).
WORKERS = {"both0": ("127.1.0.21", 0, "both"), "both1": ("127.1.0.22", 1, "both"),
           "chunk0": ("127.1.0.25", 0, "both"), "chunk1": ("127.1.0.26", 1, "both"),
           "prefill": ("127.1.0.23", 0, "prefill"),
           "decode": ("127.1.0.24", 1, "decode")}  # fmt: skip
CHUNKED = ("chunk0", "chunk1")  # 128 prefill tokens a pass (the rest: whole prefills)
# Whole prefills (0), as when docs/results.md's P/D table was measured (before chunked
# prefill was the default; docs/results.md#chunked-prefill-on-cpu).
WORKER_ARGS = ("--max-batch-size", "12", "--max-seq-len", "1600", "--stat-interval-s", "30",
               "--max-prefill-tokens-per-pass", "0")  # fmt: skip
QUICK = Load(clients=2, steady_tokens=16, long_prompts=2, long_tokens=256, warmup_s=2.0,
             quiet_s=2.0, after_s=1.0)  # fmt: skip


def _url(name: str) -> str:
    return f"http://{WORKERS[name][0]}:{WORKER_PORT}"


def _start(name: str) -> subprocess.Popen[bytes]:
    host, core, role = WORKERS[name]
    cmd = [sys.executable, "-m", "genpool_worker.worker_cli", "--model", "smollm2-135m",
           "--host", host, "--port", str(WORKER_PORT), "--role", role, *WORKER_ARGS]  # fmt: skip
    if role == "decode":
        cmd += ["--prefillers", f"{WORKERS['prefill'][0]}:{WORKER_PORT}"]
    if name in CHUNKED:
        cmd += ["--max-prefill-tokens-per-pass", "128"]  # (the later flag wins)
    with Path(LOG.format(name=name)).open("wb") as log:  # the worker's own log
        return pinned(cmd, core, stdout=log, stderr=subprocess.STDOUT)


PROBE = """import sys, time, torch
torch.set_num_threads(1)
a, b = torch.randn(1024, 576), torch.randn(576, 1536)
a @ b; time.sleep(max(0.0, float(sys.argv[1]) - time.time())); n, t = 0, time.perf_counter()
while time.perf_counter() - t < 3: a @ b; n += 1
print(n * 2 * 1024 * 576 * 1536 / (time.perf_counter() - t) / 1e9)"""


def core_probe() -> dict[str, list[float]]:
    """fp32 matmul GFLOP/s (a prefill's shape) on core 0 alone, then on cores 0 and 1 at
    once: are the two cores independent (a VM's two vCPUs may share a physical core)?"""

    def run(cores: tuple[int, ...]) -> list[float]:
        at = str(time.time() + 4)  # together, after torch's import
        procs = [pinned([sys.executable, "-c", PROBE, at], c, stdout=subprocess.PIPE)
                 for c in cores]  # fmt: skip
        return [round(float(p.communicate()[0]), 1) for p in procs]

    return {"alone_gflops": run((0,)), "both_busy_gflops": run((0, 1))}


async def _measure(setup: str, load: Load, seed: int) -> dict[str, Any]:
    names = SETUPS[setup] + (("prefill",) if setup == "pd" else ())
    loadavg = os.getloadavg()[0]
    run = await burst_run([_url(n) for n in SETUPS[setup]], {n: _url(n) for n in names},
                          load, seed)  # fmt: skip
    m0, mb, me, m1 = (run.scrapes[k] for k in ("t0", "tb", "te", "t1"))
    result: dict[str, Any] = {"setup": setup, "loadavg_1m": [loadavg, os.getloadavg()[0]]}
    result |= summarize(run.streams, run.times)
    result["step_ms"] = {n: mean_between(m0[n], m1[n], "genpool_step_seconds", 1e3) for n in names}
    if setup == "pd":
        result["pd_burst"] = pd_window(mb["decode"], me["decode"], mb["prefill"], me["prefill"])
        result["pd_whole"] = pd_window(m0["decode"], m1["decode"], m0["prefill"], m1["prefill"])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pd", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke run: small, 1 repetition")
    parser.add_argument("--reps", type=int, default=None, help="runs per setup (default 3)")
    args = parser.parse_args(argv)
    source = provenance("bench.pd", argv)  # what the workers run: the tree at start
    load, reps = (QUICK, args.reps or 1) if args.quick else (Load(), args.reps or 3)
    if not 1 <= reps <= 10:
        parser.error("--reps 1..10")
    started, probe = time.monotonic(), core_probe()
    procs = {name: _start(name) for name in WORKERS}
    entries = ("both0", "both1", "chunk0", "chunk1", "decode")
    runs = run_setups(procs, {n: _url(n) for n in procs}, entries, tuple(SETUPS), reps,
                      lambda setup, rep: _measure(setup, load, seed=rep), KEYS[:11],
                      LOG)  # fmt: skip
    config = {"load": vars(load), "reps": reps, "worker_args": WORKER_ARGS, "workers": WORKERS,
              "taskset": shutil.which("taskset") is not None, "cpus": os.cpu_count(),
              "core_probe": probe, "wall_s": round(time.monotonic() - started, 1)}  # fmt: skip
    table = medians(runs)
    ratios = {"pd/colocated": paired(runs),
              "pd/colocated-chunked": paired(runs, baseline="colocated-chunked"),
              "colocated-chunked/colocated": paired(runs, setup="colocated-chunked")}  # fmt: skip
    result = {**source, "config": config, "runs": runs, "medians": table,
              "paired": ratios}  # fmt: skip
    path = QUICK_RESULTS if args.quick else RESULTS
    path.write_text(json.dumps(result, indent=2) + "\n")
    for setup, key in itertools.product(SETUPS, KEYS):
        if (cell := table[setup].get(key)) is not None:
            print(f"{setup:9} {key:34} {cell['median']:>12} {cell['runs']}")
    print(json.dumps({"probe": probe, "paired": result["paired"]}), f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
