"""Prefill/decode disaggregation on 2 CPU cores: colocated vs P/D under a long-prompt burst.

    .venv/bin/python -m bench.pd [--quick] [--reps 3]

Four real ``genpool-worker`` processes (SmolLM2-135M, CPU, ``OMP_NUM_THREADS=1``), each
pinned to one core: ``colocated`` = two ``--role both`` workers (cores 0, 1), requests
round robin; ``pd`` = a ``--role prefill`` worker (core 0) and a ``--role decode
--prefillers <it>`` worker (core 1) that takes every request. Runs alternate the setups
(the idle pair waits). Each run: 4 closed-loop streaming clients (short prompts, 64 tokens,
greedy) and, after a warm-up and a quiet window, 6 prompts of 1024 tokens (8 tokens each)
sent at once. Measured: the steady streams' inter-token gaps inside the burst window (burst
start to the last long prompt's end) and outside it, TTFTs, tokens/s, failures; for P/D the
decode worker's TTFT parts and KV pulls over the burst window. A matmul probe first measures
what one core does alone and with the other busy. Writes ``bench/results/pd.json``
(``--quick``: a smoke run, to /tmp); docs/results.md explains the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai

from bench.pd_report import (
    KEYS,
    SETUPS,
    Stream,
    mean_between,
    medians,
    paired,
    pd_window,
    summarize,
    value_at,
)
from genpool_core.names import WORKER_PORT

RESULTS = Path(__file__).resolve().parent / "results" / "pd.json"
QUICK_RESULTS = Path("/tmp/genpool-bench-pd-quick.json")
LOG = "/tmp/genpool-bench-pd-{name}.log"
# name -> (host, core, role); outside the pod runner's 127.0/16 (a dev cluster may run).
WORKERS = {"both0": ("127.1.0.21", 0, "both"), "both1": ("127.1.0.22", 1, "both"),
           "prefill": ("127.1.0.23", 0, "prefill"),
           "decode": ("127.1.0.24", 1, "decode")}  # fmt: skip
WORKER_ARGS = ("--max-batch-size", "12", "--max-seq-len", "1600", "--stat-interval-s", "30")
STEADY_PROMPTS = (  # about 30 tokens each
    "Write a short story about a lighthouse keeper who finds a message in a bottle on a "
    "stormy night, and say what the message means to him.",
    "Explain to a new student, step by step and with one example, how a hash table stores "
    "and finds its keys, and why it is fast.",
    "Describe a walk through a busy morning market in a small coastal town: the smells, "
    "the sounds, the people and the fish.",
    "List the main causes of the French Revolution and give, for each one, a sentence on "
    "why it mattered to ordinary people.",
)  # fmt: skip


@dataclass(frozen=True)
class Load:
    clients: int = 4
    steady_tokens: int = 64
    long_prompts: int = 6
    long_tokens: int = 1024
    long_max_tokens: int = 8
    warmup_s: float = 3.0
    quiet_s: float = 5.0
    after_s: float = 3.0


QUICK = Load(clients=2, steady_tokens=16, long_prompts=2, long_tokens=256, warmup_s=2.0,
             quiet_s=2.0, after_s=1.0)  # fmt: skip


def _url(name: str) -> str:
    return f"http://{WORKERS[name][0]}:{WORKER_PORT}"


def _client(name: str) -> openai.AsyncOpenAI:
    """The standard client; no retries (a failure must count)."""
    return openai.AsyncOpenAI(base_url=_url(name) + "/v1", api_key="x", max_retries=0, timeout=600)


def _pinned(cmd: list[str], core: int, **kwargs: Any) -> subprocess.Popen[bytes]:
    """``cmd`` on one core (taskset, else the affinity set in the child), 1 OpenMP thread."""
    preexec: Callable[[], None] | None = None
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", str(core), *cmd]
    else:
        preexec = lambda: os.sched_setaffinity(0, {core})  # noqa: E731
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, preexec_fn=preexec, **kwargs)


def _start(name: str) -> subprocess.Popen[bytes]:
    host, core, role = WORKERS[name]
    cmd = [sys.executable, "-m", "genpool_worker.worker_cli", "--model", "smollm2-135m",
           "--host", host, "--port", str(WORKER_PORT), "--role", role, *WORKER_ARGS]  # fmt: skip
    if role == "decode":
        cmd += ["--prefillers", f"{WORKERS['prefill'][0]}:{WORKER_PORT}"]
    with Path(LOG.format(name=name)).open("wb") as log:  # the worker's own log
        return _pinned(cmd, core, stdout=log, stderr=subprocess.STDOUT)


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
        procs = [_pinned([sys.executable, "-c", PROBE, at], c, stdout=subprocess.PIPE)
                 for c in cores]  # fmt: skip
        return [round(float(p.communicate()[0]), 1) for p in procs]

    return {"alone_gflops": run((0,)), "both_busy_gflops": run((0, 1))}


def _wait_ready(procs: dict[str, subprocess.Popen[bytes]], timeout_s: float = 180.0) -> None:
    deadline, waiting = time.monotonic() + timeout_s, set(procs)
    while waiting and time.monotonic() < deadline:
        for name in sorted(waiting):
            if procs[name].poll() is not None:
                raise SystemExit(f"worker {name} exited; see {LOG.format(name=name)}")
            try:
                if httpx.get(_url(name) + "/ready", timeout=2).status_code == 200:
                    waiting.discard(name)
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    if waiting:
        raise SystemExit(f"workers {sorted(waiting)} not ready within {timeout_s:.0f} s")


async def _one(client: openai.AsyncOpenAI, kind: str, prompt: str | list[int],
               max_tokens: int) -> Stream:  # fmt: skip
    stream = Stream(kind, time.monotonic())
    try:
        response = await client.completions.create(
            model="smollm2-135m", prompt=prompt, max_tokens=max_tokens, temperature=0,
            stream=True, extra_body={"min_tokens": max_tokens},
        )  # fmt: skip
        async for chunk in response:
            if chunk.choices and chunk.choices[0].text and not chunk.choices[0].finish_reason:
                stream.chunks.append(time.monotonic())
            if chunk.usage is not None:
                stream.tokens = chunk.usage.completion_tokens
    except openai.OpenAIError as exc:
        stream.error = f"{type(exc).__name__}: {exc}"[:300]
    if stream.error is None and stream.tokens != max_tokens:
        stream.error = f"{stream.tokens} of {max_tokens} tokens"
    return stream


async def _steady(targets: itertools.cycle[openai.AsyncOpenAI], load: Load, index: int,
                  stop: asyncio.Event, out: list[Stream]) -> None:  # fmt: skip
    """One closed-loop client: the next request as soon as the last one ended."""
    for n in itertools.count():
        if stop.is_set():
            return
        prompt = STEADY_PROMPTS[(index + n) % len(STEADY_PROMPTS)]
        out.append(await _one(next(targets), "steady", prompt, load.steady_tokens))


async def _scrape(names: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Per worker: ``name{labels}`` -> value, labels sorted, the model's labels dropped."""
    async with httpx.AsyncClient(timeout=10) as http:
        texts = await asyncio.gather(*(http.get(_url(n) + "/metrics") for n in names))
    out: dict[str, dict[str, float]] = {}
    for name, text in zip(names, texts, strict=True):
        out[name] = series = {}
        for line in text.text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                metric, _, labels = key.partition("{")
                pairs = sorted(p for p in labels.rstrip("}").split(",")
                               if p and not p.startswith(("model=", "synthetic=")))  # fmt: skip
                series[metric + ("{" + ",".join(pairs) + "}" if pairs else "")] = float(value)
    return out


async def _measure(setup: str, load: Load, seed: int) -> dict[str, Any]:
    names = SETUPS[setup] + (("prefill",) if setup == "pd" else ())
    clients = [_client(n) for n in SETUPS[setup]]
    targets, long_targets = itertools.cycle(clients), itertools.cycle(clients)
    rng = random.Random(seed)  # the same long prompts for both setups of a repetition
    longs = [[rng.randrange(100, 30000) for _ in range(load.long_tokens)]
             for _ in range(load.long_prompts)]  # fmt: skip
    streams: list[Stream] = []
    stop, loadavg = asyncio.Event(), os.getloadavg()[0]
    tasks = [asyncio.create_task(_steady(targets, load, i, stop, streams))
             for i in range(load.clients)]  # fmt: skip
    await asyncio.sleep(load.warmup_s)
    t0, m0 = time.monotonic(), await _scrape(names)
    await asyncio.sleep(load.quiet_s)
    tb, mb = time.monotonic(), await _scrape(names)
    bursts = await asyncio.gather(*(_one(next(long_targets), "long", p, load.long_max_tokens)
                                    for p in longs))  # fmt: skip
    te, me = time.monotonic(), await _scrape(names)
    await asyncio.sleep(load.after_s)
    stop.set()
    t1 = time.monotonic()
    await asyncio.gather(*tasks)
    m1 = await _scrape(names)
    for client in clients:
        await client.close()
    result: dict[str, Any] = {"setup": setup, "loadavg_1m": [loadavg, os.getloadavg()[0]]}
    result |= summarize([*streams, *bursts], {"t0": t0, "tb": tb, "te": te, "t1": t1})
    result["step_ms"] = {n: mean_between(m0[n], m1[n], "genpool_step_seconds", 1e3) for n in names}
    if setup == "pd":
        result["pd_burst"] = pd_window(mb["decode"], me["decode"], mb["prefill"], me["prefill"])
        result["pd_whole"] = pd_window(m0["decode"], m1["decode"], m0["prefill"], m1["prefill"])
    return result


async def _warm_up() -> None:
    """A long and a short request through each entry worker (first-call costs)."""
    runs = [_one(_client(n), "long", p, 4) for n in ("both0", "both1", "decode")
            for p in (list(range(1000, 1256)), STEADY_PROMPTS[0])]  # fmt: skip
    failed = [s.error for s in await asyncio.gather(*runs) if s.error]
    if failed:
        raise SystemExit(f"warm-up failed: {failed}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pd", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke run: small, 1 repetition")
    parser.add_argument("--reps", type=int, default=None, help="runs per setup (default 3)")
    args = parser.parse_args(argv)
    load, reps = (QUICK, args.reps or 1) if args.quick else (Load(), args.reps or 3)
    if not 1 <= reps <= 10:
        parser.error("--reps 1..10")
    started, probe = time.monotonic(), core_probe()
    procs, runs = {name: _start(name) for name in WORKERS}, []
    try:
        _wait_ready(procs)
        asyncio.run(_warm_up())
        for rep, setup in itertools.product(range(reps), SETUPS):  # A, B, A, B, ...
            runs.append(asyncio.run(_measure(setup, load, seed=rep)) | {"rep": rep})
            shown = {k: value_at(runs[-1], k) for k in ("rep", *KEYS[:11])}
            print(setup, json.dumps(shown), flush=True)
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=30)
    config = {"load": vars(load), "reps": reps, "worker_args": WORKER_ARGS, "workers": WORKERS,
              "taskset": shutil.which("taskset") is not None, "cpus": os.cpu_count(),
              "core_probe": probe, "wall_s": round(time.monotonic() - started, 1)}  # fmt: skip
    table = medians(runs)
    result = {"config": config, "runs": runs, "medians": table, "paired": paired(runs)}
    path = QUICK_RESULTS if args.quick else RESULTS
    path.write_text(json.dumps(result, indent=2) + "\n")
    for setup, key in itertools.product(SETUPS, KEYS):
        if (cell := table[setup].get(key)) is not None:
            print(f"{setup:9} {key:34} {cell['median']:>12} {cell['runs']}")
    print(json.dumps({"probe": probe, "paired": result["paired"]}), f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
