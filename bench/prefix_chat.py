"""Prefix caching on one CPU core: multi-turn chats against SmolLM2, cache on and off.

    .venv/bin/python -m bench.prefix_chat [--quick] [--reps 2]

Two real ``genpool-worker`` processes (SmolLM2-135M, CPU, ``OMP_NUM_THREADS=1``), both
pinned to core 0, differing only in ``--no-enable-prefix-caching``; the bench's streaming
``openai`` clients run on core 1 and the setups take turns (the idle worker waits).

1. **Turns.** Per run, ``CONVERSATIONS`` chats at once, each ``TURNS`` turns: a shared
   system prompt, then every turn resends the whole history (earlier user messages and
   the model's replies) plus a new user message, greedy, ``REPLY_TOKENS`` tokens a
   reply, so histories grow to 1-2k tokens (a ~700-token system prompt). Each repetition
   has its own conversations (new users: only the system prompt is cached from before).
   Measured per turn: TTFT (client side, first content chunk), the reply's text and
   ``usage.prompt_tokens_details.cached_tokens``.
   Reported: TTFT p50/p90 of turns >= 2 per setup and their paired ratio, whether the
   greedy text of every turn is the same in both setups, and the measured hit rate
   (``vllm:prefix_cache_hits / queries`` deltas) against the oracle hit rate of the
   same trace (an infinite cache holding every earlier turn's prompt and reply,
   ``bench.prefix_report``).
2. **Residents at equal memory.** Both workers restarted with the same small KV budget
   (``RESIDENT_BLOCKS`` blocks) and a large batch; ``RESIDENT_REQUESTS`` requests sharing
   a ~1k-token system prompt arrive at once; ``vllm:num_requests_running`` is sampled
   while they run: its max and mean per setup.

Writes ``bench/results/prefix_chat.json`` (``--quick``: a smoke run, to /tmp) with the
commit and the command; docs/results.md explains the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from bench import prefix_report as report
from bench.provenance import provenance
from bench.serving_load import client, pinned, scrape, wait_ready
from genpool_core.names import WORKER_PORT

RESULTS = Path(__file__).resolve().parent / "results" / "prefix_chat.json"
QUICK_RESULTS = Path("/tmp/genpool-bench-prefix-chat-quick.json")
LOG = "/tmp/genpool-bench-prefix-{name}.log"
WORKER_CORE, CLIENT_CORE = 0, 1
MODEL = "smollm2-135m"
WORKERS = {"cached": "127.1.0.41", "uncached": "127.1.0.42"}  # outside the pod runner's /16
FLAGS = {"cached": [], "uncached": ["--no-enable-prefix-caching"]}
WORKER_ARGS = ["--max-batch-size", "8", "--max-seq-len", "2304", "--stat-interval-s", "30"]
BLOCK_SIZE = 16  # the worker's default
CONVERSATIONS, TURNS, REPLY_TOKENS = 3, 6, 24
RESIDENT_BLOCKS, RESIDENT_REQUESTS, RESIDENT_TOKENS = 640, 32, 48
SENTENCES = (
    "The harbour was quiet in the early morning, and the fishing boats rocked gently.",
    "A hash table keeps its keys in buckets chosen by a hash of the key.",
    "The committee met twice a week to review the budget and the hiring plan.",
    "Rain had fallen all night, so the river was high and brown by dawn.",
    "She wrote the first draft in a single afternoon and revised it for a month.",
    "The old library held maps of coastlines that no longer look the same.",
    "Compilers turn source code into instructions a processor can run.",
    "In the market, traders shouted prices over the noise of carts and bells.",
    "The experiment failed three times before the team found the loose cable.",
    "Mountain villages often depend on a single road that snow can close for weeks.",
    "A good summary keeps the argument and drops the examples.",
    "The orchestra tuned to the oboe, as it always does, before the overture.",
)  # fmt: skip


def _paragraph(seed: int, sentences: int) -> str:
    n = len(SENTENCES)
    return " ".join(SENTENCES[(seed * 7 + 3 * i) % n] for i in range(sentences))


def system_prompt(sentences: int) -> dict[str, str]:
    text = "You are a careful assistant. Answer briefly. Background notes: "
    return {"role": "system", "content": text + _paragraph(0, sentences)}


def user_message(conversation: int, turn: int) -> dict[str, str]:
    return {"role": "user", "content": f"Question {turn + 1}: summarise this in one line. "
                                       + _paragraph(101 * conversation + turn, 9)}  # fmt: skip


async def _turn(api: openai.AsyncOpenAI, messages: list[dict[str, str]], c: int, k: int
                ) -> report.Turn:  # fmt: skip
    start = time.monotonic()
    first: float | None = None
    text, prompt, cached, error = "", 0, 0, None
    try:
        stream = await api.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=REPLY_TOKENS, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"min_tokens": REPLY_TOKENS},
        )  # type: ignore[call-overload]  # fmt: skip
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.monotonic()
                text += chunk.choices[0].delta.content
            if chunk.usage is not None:
                prompt = chunk.usage.prompt_tokens
                details = chunk.usage.prompt_tokens_details
                cached = (details.cached_tokens or 0) if details is not None else 0
    except openai.OpenAIError as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    ttft = (first or time.monotonic()) - start
    return report.Turn(c, k, ttft, text, prompt, cached, error)


async def _conversation(api: openai.AsyncOpenAI, c: int, turns: int, system: dict[str, str]
                        ) -> list[report.Turn]:  # fmt: skip
    messages, out = [system], []
    for k in range(turns):
        messages.append(user_message(c, k))
        turn = await _turn(api, messages, c, k)
        out.append(turn)
        messages.append({"role": "assistant", "content": turn.text})
    return out


SYSTEM_SENTENCES = 45  # about 700 tokens: histories of 1-2k tokens from the second turn


async def run_turns(url: str, conversations: int, turns: int, first: int = 0
                    ) -> list[report.Turn]:  # fmt: skip
    """``conversations`` chats numbered from ``first`` (each rep its own: the cache holds
    only the shared system prompt from an earlier rep, as for a new user)."""
    api = client(url)
    system = system_prompt(SYSTEM_SENTENCES)
    async with api:  # closed in this event loop
        chats = await asyncio.gather(*(_conversation(api, first + c, turns, system)
                                       for c in range(conversations)))  # fmt: skip
    return [turn for chat in chats for turn in chat]


def _series(scraped: dict[str, float], name: str) -> float:
    return sum(v for k, v in scraped.items() if k.split("{")[0] == name)


async def run_residents(url: str, requests: int) -> dict[str, float]:
    """``requests`` chats sharing a long system prompt at once; residents sampled."""
    api, samples, done = client(url), [], asyncio.Event()

    async def sample() -> None:
        async with httpx.AsyncClient(timeout=5) as http:
            while not done.is_set():
                text = (await http.get(url + "/metrics")).text
                for line in text.splitlines():
                    if line.startswith("vllm:num_requests_running"):
                        samples.append(float(line.rpartition(" ")[2]))
                await asyncio.sleep(0.2)  # the sampling period, not a synchronisation

    async def one(i: int) -> report.Turn:
        messages = [system_prompt(70), {"role": "user", "content": f"Item {i}: one word."}]
        return await _turn(api, messages, i, 0)

    sampler = asyncio.create_task(sample())
    async with api:  # closed in this event loop
        turns = await asyncio.gather(*(one(i) for i in range(requests)))
    done.set()
    await sampler
    return {"residents_max": max(samples, default=0.0),
            "residents_mean": sum(samples) / len(samples) if samples else 0.0,
            "failed": float(sum(t.error is not None for t in turns))}  # fmt: skip


def _start(name: str, extra: list[str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "genpool_worker.worker_cli", "--model", MODEL,
           "--host", WORKERS[name], "--port", str(WORKER_PORT), *WORKER_ARGS, *FLAGS[name],
           *extra]  # fmt: skip
    log = open(LOG.format(name=name), "w")  # noqa: SIM115 (the worker's own log)
    return pinned(cmd, WORKER_CORE, stdout=log, stderr=subprocess.STDOUT)


def _oracle(turns: list[report.Turn]) -> dict[str, float]:
    """The trace's oracle hit rate: each turn's prompt as the worker renders it, and
    what it computed (the prompt and the reply's tokens), in arrival order."""
    from genpool_worker.chat_template import chat_prompter
    from genpool_worker.engine_io import ModelInfo
    from genpool_worker.model import find_smollm2_gguf
    from genpool_worker.model.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(find_smollm2_gguf())
    prompter = chat_prompter(tokenizer, ModelInfo(MODEL, False, 2304, ()))
    by_chat: dict[int, list[report.Turn]] = {}
    for turn in turns:
        by_chat.setdefault(turn.conversation, []).append(turn)
    prompts, computed = [], []
    for k in range(max(t.index for t in turns) + 1):  # turn k of every chat, then k + 1
        for c, chat in sorted(by_chat.items()):
            messages = [system_prompt(SYSTEM_SENTENCES)]
            for earlier in chat[:k]:
                messages += [user_message(c, earlier.index),
                             {"role": "assistant", "content": earlier.text}]  # fmt: skip
            ids = prompter.prompt_ids([*messages, user_message(c, k)])
            prompts.append(ids)
            computed.append(ids + tokenizer.encode(chat[k].text))
    hits = report.oracle_hit_tokens(prompts, computed, BLOCK_SIZE)
    return {"oracle_hit_rate": sum(hits) / sum(len(p) for p in prompts),
            "prompt_tokens_max": float(max(len(p) for p in prompts))}  # fmt: skip


async def _turn_runs(reps: int, conversations: int, num_turns: int) -> dict[str, Any]:
    urls = {name: f"http://{host}:{WORKER_PORT}" for name, host in WORKERS.items()}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in WORKERS}
    for rep in range(reps):
        for name in WORKERS if rep % 2 == 0 else reversed(WORKERS):  # alternate the order
            before = (await scrape({name: urls[name]}))[name]
            turns = await run_turns(urls[name], conversations, num_turns, 100 * rep)
            after = (await scrape({name: urls[name]}))[name]
            queries = _series(after, "vllm:prefix_cache_queries_total") - _series(
                before, "vllm:prefix_cache_queries_total")  # fmt: skip
            hits = _series(after, "vllm:prefix_cache_hits_total") - _series(
                before, "vllm:prefix_cache_hits_total")  # fmt: skip
            runs[name].append({"turns": [t.__dict__ for t in turns],
                               "ttft_later_turns": report.ttft_summary(turns),
                               "ttft_first_turns": report.ttft_summary(turns, from_turn=0),
                               "hit_rate": hits / queries if queries else 0.0,
                               "oracle": _oracle(turns),
                               "failed": sum(t.error is not None for t in turns)})  # fmt: skip
    return runs


def _summary(runs: dict[str, Any]) -> dict[str, Any]:
    cached, uncached = runs["cached"], runs["uncached"]

    def as_turns(run: dict[str, Any]) -> list[report.Turn]:
        return [report.Turn(**t) for t in run["turns"]]

    equal = all(report.texts_equal(as_turns(a), as_turns(b))
                for a, b in zip(cached, uncached, strict=True))  # fmt: skip
    out: dict[str, Any] = {"texts_equal": equal}
    for stat in ("p50", "p90"):
        out[f"ttft_{stat}_ratio_uncached_over_cached"] = report.paired_ratio(
            [r["ttft_later_turns"][stat] for r in uncached],
            [r["ttft_later_turns"][stat] for r in cached])  # fmt: skip
    out["hit_rate"] = [r["hit_rate"] for r in cached]
    out["oracle_hit_rate"] = [r["oracle"]["oracle_hit_rate"] for r in cached]
    return out


def _kv_bytes_per_block() -> int:
    from genpool_core.model_catalogue import known_shape

    shape = known_shape(MODEL)
    assert shape is not None
    return shape.kv_bytes_per_token(4) * BLOCK_SIZE  # fp32 on the CPU


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for proc in procs.values():
        proc.terminate()
    for proc in procs.values():
        proc.wait(timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run, to /tmp")
    parser.add_argument("--reps", type=int, default=2)
    ns = parser.parse_args(argv)
    conversations, turns = (1, 3) if ns.quick else (CONVERSATIONS, TURNS)
    import os

    os.sched_setaffinity(0, {CLIENT_CORE})
    urls = {name: f"http://{host}:{WORKER_PORT}" for name, host in WORKERS.items()}
    procs = {name: _start(name, []) for name in WORKERS}
    try:
        wait_ready(procs, urls, LOG)
        runs = asyncio.run(_turn_runs(1 if ns.quick else ns.reps, conversations, turns))
    finally:
        _stop(procs)
    memory = ["--kv-cache-memory", str(RESIDENT_BLOCKS * _kv_bytes_per_block()),
              "--max-batch-size", "32", "--max-prefill-tokens-per-pass", "0"]  # fmt: skip
    procs = {name: _start(name, memory) for name in WORKERS}
    try:
        wait_ready(procs, urls, LOG)
        requests = 8 if ns.quick else RESIDENT_REQUESTS
        residents = {name: asyncio.run(run_residents(urls[name], requests)) for name in WORKERS}
    finally:
        _stop(procs)
    setup = {"conversations": conversations, "turns": turns, "reply_tokens": REPLY_TOKENS,
             "resident_blocks": RESIDENT_BLOCKS}  # fmt: skip
    result = {**provenance("bench.prefix_chat", argv), "summary": _summary(runs),
              "residents": residents, "runs": runs, "setup": setup}  # fmt: skip
    path = QUICK_RESULTS if ns.quick else RESULTS
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps({"summary": result["summary"], "residents": residents}, indent=1))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
