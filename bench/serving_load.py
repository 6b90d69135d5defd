"""The serving benches' load (``bench.pd``, ``bench.chunked_prefill``): real
``genpool-worker`` processes pinned to a core, closed-loop streaming ``openai`` clients
and a burst of long prompts between two quiet windows, with ``/metrics`` scraped at each
window edge. The runs' arithmetic is ``bench.pd_report`` (pure)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import shutil
import subprocess
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import openai

from bench.pd_report import Stream, value_at

MODEL = "smollm2-135m"
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
Scrape = dict[str, dict[str, float]]  # worker name -> series -> value


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


@dataclass
class BurstRun:
    """One run's streams, its window edges (t0 quiet start, tb burst start, te burst end,
    t1 end) and the scrapes taken at each edge."""

    streams: list[Stream]
    times: dict[str, float]
    scrapes: dict[str, Scrape]


def client(url: str) -> openai.AsyncOpenAI:
    """The standard client; no retries (a failure must count)."""
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)


def pinned(cmd: list[str], core: int, **kwargs: Any) -> subprocess.Popen[bytes]:
    """``cmd`` on one core (taskset, else the affinity set in the child), 1 OpenMP thread."""
    preexec: Callable[[], None] | None = None
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", str(core), *cmd]
    else:
        preexec = lambda: os.sched_setaffinity(0, {core})  # noqa: E731
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, preexec_fn=preexec, **kwargs)


def wait_ready(procs: dict[str, subprocess.Popen[bytes]], urls: dict[str, str], log: str,
               timeout_s: float = 180.0) -> None:  # fmt: skip
    """Until every worker answers ``/ready``; one that exits stops the bench (``log``
    formatted with its name says where its output is)."""
    deadline, waiting = time.monotonic() + timeout_s, set(procs)
    while waiting and time.monotonic() < deadline:
        for name in sorted(waiting):
            if procs[name].poll() is not None:
                raise SystemExit(f"worker {name} exited; see {log.format(name=name)}")
            try:
                if httpx.get(urls[name] + "/ready", timeout=2).status_code == 200:
                    waiting.discard(name)
            except httpx.HTTPError:
                pass  # not listening yet: asked again next round
        time.sleep(0.5)
    if waiting:
        raise SystemExit(f"workers {sorted(waiting)} not ready within {timeout_s:.0f} s")


async def one_stream(client: openai.AsyncOpenAI, kind: str, prompt: str | list[int],
                     max_tokens: int) -> Stream:  # fmt: skip
    """One greedy streamed completion of exactly ``max_tokens`` tokens, timed per chunk."""
    stream = Stream(kind, time.monotonic())
    try:
        response = await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
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


async def _steady(targets: Iterator[openai.AsyncOpenAI], tokens: int, index: int,
                  stop: asyncio.Event, out: list[Stream]) -> None:  # fmt: skip
    """One closed-loop client: the next request as soon as the last one ended."""
    for n in itertools.count():
        if stop.is_set():
            return
        prompt = STEADY_PROMPTS[(index + n) % len(STEADY_PROMPTS)]
        out.append(await one_stream(next(targets), "steady", prompt, tokens))


async def scrape(urls: dict[str, str]) -> Scrape:
    """Per worker: ``name{labels}`` -> value, labels sorted, the model's labels dropped."""
    async with httpx.AsyncClient(timeout=10) as http:
        texts = await asyncio.gather(*(http.get(url + "/metrics") for url in urls.values()))
    out: Scrape = {}
    for name, text in zip(urls, texts, strict=True):
        out[name] = series = {}
        for line in text.text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                metric, _, labels = key.partition("{")
                pairs = sorted(p for p in labels.rstrip("}").split(",")
                               if p and not p.startswith(("model=", "synthetic=")))  # fmt: skip
                series[metric + ("{" + ",".join(pairs) + "}" if pairs else "")] = float(value)
    return out


def long_prompts(load: Load, seed: int) -> list[list[int]]:
    """The burst's prompts (token ids): the same for every setup of one repetition."""
    rng = random.Random(seed)
    return [[rng.randrange(100, 30000) for _ in range(load.long_tokens)]
            for _ in range(load.long_prompts)]  # fmt: skip


async def burst_run(targets: list[str], scraped: dict[str, str], load: Load,
                    seed: int) -> BurstRun:  # fmt: skip
    """Steady clients round robin over ``targets`` (URLs); after the warm-up and a quiet
    window, the long prompts at once (also round robin); then ``after_s`` more."""
    clients = [client(url) for url in targets]
    steady_targets, long_targets = itertools.cycle(clients), itertools.cycle(clients)
    streams: list[Stream] = []
    stop, times, scrapes = asyncio.Event(), {}, {}
    tasks = [asyncio.create_task(_steady(steady_targets, load.steady_tokens, i, stop, streams))
             for i in range(load.clients)]  # fmt: skip
    await asyncio.sleep(load.warmup_s)
    times["t0"], scrapes["t0"] = time.monotonic(), await scrape(scraped)
    await asyncio.sleep(load.quiet_s)
    times["tb"], scrapes["tb"] = time.monotonic(), await scrape(scraped)
    bursts = await asyncio.gather(*(one_stream(next(long_targets), "long", p,
                                               load.long_max_tokens)
                                    for p in long_prompts(load, seed)))  # fmt: skip
    times["te"], scrapes["te"] = time.monotonic(), await scrape(scraped)
    await asyncio.sleep(load.after_s)
    stop.set()
    times["t1"] = time.monotonic()
    await asyncio.gather(*tasks)
    scrapes["t1"] = await scrape(scraped)
    for each in clients:
        await each.close()
    return BurstRun([*streams, *bursts], times, scrapes)


async def warm_up(urls: list[str], long_tokens: int = 256) -> None:
    """A long and a short request through each entry worker (first-call costs)."""
    clients = [client(url) for url in urls]
    runs = [one_stream(each, "long", p, 4) for each in clients
            for p in (list(range(1000, 1000 + long_tokens)), STEADY_PROMPTS[0])]  # fmt: skip
    failed = [s.error for s in await asyncio.gather(*runs) if s.error]
    for each in clients:
        await each.close()
    if failed:
        raise SystemExit(f"warm-up failed: {failed}")


def run_setups(procs: dict[str, subprocess.Popen[bytes]], urls: dict[str, str],
               entries: Sequence[str], setups: Sequence[str], reps: int,
               measure: Callable[[str, int], Coroutine[Any, Any, dict[str, Any]]],
               shown: Sequence[str], log: str) -> list[dict[str, Any]]:  # fmt: skip
    """Once the workers are ready and warm (a request through each of ``entries``): the
    setups in turn, ``reps`` times (A, B, A, B, ...), each run printed as it ends (its
    ``shown`` keys); the workers are stopped however it ends."""
    runs: list[dict[str, Any]] = []
    try:
        wait_ready(procs, urls, log)
        asyncio.run(warm_up([urls[name] for name in entries]))
        for rep, setup in itertools.product(range(reps), setups):
            runs.append(asyncio.run(measure(setup, rep)) | {"rep": rep})
            print(setup, json.dumps({k: value_at(runs[-1], k) for k in ("rep", *shown)}),
                  flush=True)  # fmt: skip
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=30)
    return runs
