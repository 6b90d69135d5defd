"""Where tokens/s goes with preemption on: one real SmolLM2 worker, equal closed-loop load.

    nice -n 10 .venv/bin/python -m bench.preemption_cost [--reps 3] [--duration 40]

Starts one ``genpool-worker`` (SmolLM2-135M, CPU, ``OMP_NUM_THREADS=1``, B = 4) per run
on a loopback address, alternating preemption ``off`` and ``target_output_tps``
(T = 4 tok/s, default headroom and paused cap: the demo's pool per worker), and drives
it with the demo's closed loop (6 clients = the demo's 12 over 2 workers, 24 tokens
each, keyed on receipt as any client's are). Each run reads the worker's counters before
and after the load window and samples ``/stats`` twice a second, and breaks tokens/s down as

    tokens/s = passes/s * tokens per pass,   passes/s = 1 / (step time + engine overhead)

with step time from ``genpool_step_seconds`` (the model's work in a pass) and the
mean of residents / active (decoding) / paused / waiting from the samples. Writes
``bench/results/preemption_cost.json``; docs/results.md explains the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.provenance import provenance
from genpool_core.names import WORKER_PORT
from genpool_devcluster.loadgen import StaticPicker, closed_loop, summarize
from genpool_operator.scrape import PodTarget

RESULTS = Path(__file__).resolve().parent / "results" / "preemption_cost.json"
HOST = "127.1.0.7"  # outside the pod runner's 127.0/16, so a dev cluster can run alongside
LOG = Path("/tmp/genpool-preemption-cost-worker.log")
MODES = ("off", "target_output_tps")
WORKER_ARGS = ("--max-batch-size", "4", "--max-seq-len", "512", "--stat-interval-s", "5")
# Synthetic steps slowed to about SmolLM2's on one idle core (~75 ms at batch 4).
SYNTHETIC_TIME_SCALE = 2.5
COUNTERS = ("tokens_total", "passes", "completed_total", "pauses_total", "arrivals_total")


def _start_worker(mode: str, model: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "genpool_worker.worker_cli", "--model", model,
           "--host", HOST, "--port", str(WORKER_PORT), "--preemption-mode", mode,
           *WORKER_ARGS]  # fmt: skip
    if mode == "target_output_tps":
        cmd += ["--target-output-tps", "4"]
    if model.startswith("synthetic:"):
        cmd += ["--synthetic-time-scale", str(SYNTHETIC_TIME_SCALE)]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    log = LOG.open("ab")  # the worker's own log, for a start that fails
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


def _wait_ready(proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"worker exited with {proc.returncode} before it was ready; see {LOG}")
        try:
            if httpx.get(f"http://{HOST}:{WORKER_PORT}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"worker not ready within {timeout_s:.0f} s")


async def _counters(http: httpx.AsyncClient) -> dict[str, float]:
    stats = (await http.get(f"http://{HOST}:{WORKER_PORT}/stats")).json()
    metrics = (await http.get(f"http://{HOST}:{WORKER_PORT}/metrics")).text
    out = {key: float(stats[key]) for key in COUNTERS}
    for line in metrics.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith(("genpool_step_seconds_sum", "genpool_step_seconds_count")):
            out[name.split("{")[0].removeprefix("genpool_")] = float(value)
    return out


GAUGES = {"genpool_residents": "residents", "genpool_active": "active",
          "genpool_paused": "paused", "genpool_queue_length": "waiters"}  # fmt: skip


async def _sample(http: httpx.AsyncClient, stop: asyncio.Event) -> list[dict[str, float]]:
    """The worker's momentary occupancy (its Prometheus gauges), twice a second."""
    samples = []
    while not stop.is_set():
        text = (await http.get(f"http://{HOST}:{WORKER_PORT}/metrics")).text
        sample = {}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if (key := GAUGES.get(name.split("{")[0])) is not None:
                sample[key] = float(value)
        samples.append(sample)
        await asyncio.sleep(0.5)
    return samples


async def _measure(clients: int, duration_s: float, max_tokens: int) -> dict[str, Any]:
    picker = StaticPicker([PodTarget("bench", HOST, "bench")])
    async with httpx.AsyncClient(timeout=10) as http:
        before, stop = await _counters(http), asyncio.Event()
        sampler = asyncio.create_task(_sample(http, stop))
        started = time.monotonic()
        results = await closed_loop(
            picker, clients=clients, duration_s=duration_s, max_tokens=max_tokens
        )
        wall_s = time.monotonic() - started
        stop.set()
        samples = await sampler
        after = await _counters(http)
        knobs = (await http.get(f"http://{HOST}:{WORKER_PORT}/config")).json()["in_force"]
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    load = summarize(results, wall_s)
    return breakdown(delta, wall_s, samples) | {"knobs": knobs, "load": load}


def breakdown(
    delta: dict[str, float], wall_s: float, samples: list[dict[str, float]]
) -> dict[str, Any]:
    """tokens/s as passes/s x tokens per pass, and where a pass's time goes."""
    passes = delta["passes"]
    steps = delta["step_seconds_count"]
    step_s = delta["step_seconds_sum"] / steps if steps else None
    pass_s = wall_s / passes if passes else None
    return {
        "wall_s": round(wall_s, 2),
        "tokens_per_s": round(delta["tokens_total"] / wall_s, 2),
        "passes_per_s": round(passes / wall_s, 2),
        "tokens_per_pass": round(delta["tokens_total"] / passes, 3) if passes else None,
        "pass_ms": round(pass_s * 1e3, 2) if pass_s else None,
        "step_ms": round(step_s * 1e3, 2) if step_s else None,
        "prefills": int(delta["arrivals_total"]),
        "completed": int(delta["completed_total"]),
        "pauses": int(delta["pauses_total"]),
        **{
            f"mean_{k}": round(statistics.fmean(s[k] for s in samples), 2)
            for k in ("residents", "active", "paused", "waiters")
            if samples
        },
    }


def run_one(
    mode: str, model: str, clients: int, duration_s: float, max_tokens: int
) -> dict[str, Any]:
    proc = _start_worker(mode, model)
    try:
        _wait_ready(proc)
        asyncio.run(_measure(clients, 5.0, max_tokens))  # warm-up, discarded
        return {"mode": mode} | asyncio.run(_measure(clients, duration_s, max_tokens))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.preemption_cost", description=__doc__)
    parser.add_argument(
        "--model",
        default="smollm2-135m",
        help="smollm2-135m, or synthetic:<name> (sleeps the step model: no CPU noise)",
    )
    parser.add_argument("--reps", type=int, default=3, help="runs per mode, interleaved")
    parser.add_argument("--duration", type=float, default=40.0, help="seconds of load per run")
    parser.add_argument("--clients", type=int, default=6, help="closed-loop clients")
    parser.add_argument("--max-tokens", type=int, default=24, help="tokens per request")
    args = parser.parse_args(argv)
    if not (1 <= args.reps <= 20 and 5 <= args.duration <= 600 and 1 <= args.clients <= 64):
        parser.error("--reps 1..20, --duration 5..600, --clients 1..64")
    source = provenance("bench.preemption_cost", argv)  # the tree the workers run
    runs = []
    for rep in range(args.reps):
        for mode in MODES if rep % 2 == 0 else MODES[::-1]:
            run = run_one(mode, args.model, args.clients, args.duration, args.max_tokens)
            runs.append(run | {"rep": rep, "loadavg_1m": os.getloadavg()[0]})
            print(json.dumps({k: v for k, v in run.items() if k != "load"}), flush=True)
    is_synthetic = args.model.startswith("synthetic:")
    config = vars(args) | {"worker_args": WORKER_ARGS, "target_output_tps": 4}
    if is_synthetic:
        config["synthetic_time_scale"] = SYNTHETIC_TIME_SCALE
    result = {**source, "config": config, "runs": runs, "means": _means(runs),
              "paired": paired_ratios(runs)}  # fmt: skip
    suffix = "_synthetic" if is_synthetic else ""
    path = RESULTS.with_name(f"preemption_cost{suffix}.json")
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"means": result["means"], "paired": result["paired"]}, indent=2))
    return 0


def _means(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    keys = [k for k, v in runs[0].items() if isinstance(v, int | float) and k != "rep"]
    return {
        mode: {k: round(statistics.fmean(r[k] for r in runs if r["mode"] == mode), 3) for k in keys}
        for mode in MODES
    }


PAIRED = ("tokens_per_s", "tokens_per_pass", "passes_per_s", "step_ms", "mean_active")


def paired_ratios(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """on / off within each repetition (back-to-back runs share the machine's load)."""
    ratios: dict[str, list[float]] = {key: [] for key in PAIRED}
    for rep in sorted({r["rep"] for r in runs}):
        pair = {r["mode"]: r for r in runs if r["rep"] == rep}
        if len(pair) < len(MODES):
            continue
        for key in PAIRED:
            ratios[key].append(round(pair[MODES[1]][key] / pair[MODES[0]][key], 3))
    return {key: {"per_rep": v, "mean": round(statistics.fmean(v), 3)} for key, v in ratios.items()
            if v}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
