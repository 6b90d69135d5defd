"""Speculative decoding on one CPU core: SmolLM2 without drafts, with n-gram drafts, and
with early-exit drafts (its first layers).

    .venv/bin/python -m bench.speculative [--quick] [--reps 2]

Three real ``genpool-worker`` processes (SmolLM2-135M, CPU, ``OMP_NUM_THREADS=1``), all
pinned to core 0, differing only in ``--speculative-config`` (``SPECS``); the bench's
streaming ``openai`` clients run on core 1 and the setups take turns (the idle workers
wait), the order reversed each repetition.

1. **Per-request speed.** Three workloads of chat requests, greedy: ``code`` (rewrite a
   function with one rename: the reply copies its prompt), ``summary`` (summarise and
   quote a paragraph) and ``chat`` (open questions: little to copy). Each at batch 1
   (requests one after another) and batch 8 (eight at once). Per request: decode rate
   (tokens after the first over the time from first to last chunk) and the reply's
   text. Reported per workload and batch: the rate's median per setup, each drafting
   setup's paired ratio to plain, whether every text is the same in every setup, and
   each drafting setup's acceptance rate
   (``vllm:spec_decode_num_accepted_tokens`` over ``_num_draft_tokens`` deltas) with
   the mean tokens a drafting request emitted per step.
2. **The SLO mode at equal load.** The workers restarted in ``target_output_tps`` mode
   (``SLO_T`` tokens/s, B = 4); the same open-loop schedule of ``SLO_REQUESTS`` mixed
   requests (Poisson, ``SLO_RATE`` a second, seeded: about 60 output tokens/s, above what
   the plain worker's batch of 4 decodes on one core, about 53) is sent to each.
   Reported: TTFT p90 and the share of requests whose decode rate is below T, per setup.

Writes ``bench/results/speculative.json`` (``--quick``: a smoke run, to /tmp) with the
commit and the command; docs/results.md explains the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import openai

from bench.provenance import provenance
from bench.serving_load import client, pinned, scrape, wait_ready
from genpool_core.names import WORKER_PORT

RESULTS = Path(__file__).resolve().parent / "results" / "speculative.json"
QUICK_RESULTS = Path("/tmp/genpool-bench-speculative-quick.json")
LOG = "/tmp/genpool-bench-speculative-{name}.log"
WORKER_CORE, CLIENT_CORE = 0, 1
MODEL = "smollm2-135m"
# Outside the pod runner's /16.
WORKERS = {"plain": "127.1.0.51", "ngram": "127.1.0.52", "early_exit": "127.1.0.53"}
# early_exit: 24 of SmolLM2's 30 layers, 2 drafts (the fastest of 12-27 layers x 1-3
# drafts in a batch-1 probe; every one was slower than plain decoding).
SPECS = {"ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                   "prompt_lookup_min": 2},
         "early_exit": {"method": "early_exit", "num_speculative_tokens": 2,
                        "num_draft_layers": 24}}  # fmt: skip
FLAGS = {"plain": [], **{name: ["--speculative-config", json.dumps(spec)]
                         for name, spec in SPECS.items()}}  # fmt: skip
WORKER_ARGS = ["--max-batch-size", "8", "--max-seq-len", "1024", "--stat-interval-s", "30"]
REPLY_TOKENS = 96
SLO_T, SLO_RATE, SLO_REQUESTS = 10.0, 0.8, 40
SLO_ARGS = [
    "--max-batch-size",
    "4",
    "--preemption-mode",
    "target_output_tps",
    "--target-output-tps",
    str(SLO_T),
    "--paused-cap",
    "2",
    "--resident-headroom",
    "2",
]
CODE = """def total_price(items, tax_rate):
    total = 0
    for item in items:
        total += item.price * item.quantity
    total = total * (1 + tax_rate)
    return round(total, 2)
"""
PARAGRAPHS = (
    "The city council met on Tuesday to discuss the new bus routes. After a long debate,"
    " the council agreed to add two routes to the northern suburbs and to run buses every"
    " ten minutes at peak hours, starting next spring.",
    "Bees visit flowers to collect nectar and pollen. As they move from flower to flower,"
    " they carry pollen with them, which lets plants make seeds. Without bees, many fruits"
    " and vegetables would be much harder to grow.",
)
QUESTIONS = ("What makes a good breakfast?", "Why do people enjoy travelling?",
             "How should I start learning to paint?", "What is the best way to keep a plant"
             " alive indoors?")  # fmt: skip


def messages(workload: str, i: int) -> list[dict[str, str]]:
    if workload == "code":
        names = ("result", "amount", "subtotal", "value")
        ask = (
            f"Rewrite this Python function, renaming the variable total to {names[i % 4]}."
            f" Reply with the whole function only.\n\n{CODE}"
        )
    elif workload == "summary":
        ask = (
            f"Summarise this paragraph, quoting its key sentence exactly:\n\n"
            f"{PARAGRAPHS[i % len(PARAGRAPHS)]}"
        )
    else:
        ask = QUESTIONS[i % len(QUESTIONS)]
    return [{"role": "user", "content": ask}]


@dataclass
class Reply:
    workload: str
    index: int
    start: float
    first: float | None = None
    last: float | None = None
    tokens: int = 0
    text: str = ""
    error: str | None = None

    @property
    def rate(self) -> float | None:
        """Decode tokens/s: the tokens after the first over first-to-last chunk time."""
        if self.first is None or self.last is None or self.tokens < 8 or self.last <= self.first:
            return None
        return (self.tokens - 1) / (self.last - self.first)

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.start


async def one(api: openai.AsyncOpenAI, workload: str, i: int) -> Reply:
    reply = Reply(workload, i, time.monotonic())
    try:
        stream = await api.chat.completions.create(
            model=MODEL, messages=messages(workload, i), max_tokens=REPLY_TOKENS,
            temperature=0, stream=True, stream_options={"include_usage": True},
        )  # type: ignore[call-overload]  # fmt: skip
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                now = time.monotonic()
                reply.first = reply.first or now
                reply.last = now
                reply.text += chunk.choices[0].delta.content
            if chunk.usage is not None:
                reply.tokens = chunk.usage.completion_tokens
    except openai.OpenAIError as exc:
        reply.error = f"{type(exc).__name__}: {exc}"[:300]
    return reply


def _drafts(scraped: dict[str, float]) -> tuple[float, float, float]:
    def total(name: str) -> float:
        return sum(v for k, v in scraped.items() if k.split("{")[0] == name)

    return (total("vllm:spec_decode_num_drafts_total"),
            total("vllm:spec_decode_num_draft_tokens_total"),
            total("vllm:spec_decode_num_accepted_tokens_total"))  # fmt: skip


async def speed_run(url: str, workload: str, batch: int, count: int) -> dict[str, Any]:
    """``count`` requests, ``batch`` at a time; their replies and the drafts' deltas."""
    before = _drafts((await scrape({"w": url}))["w"])
    replies: list[Reply] = []
    async with client(url) as api:
        for first in range(0, count, batch):
            wave = range(first, min(count, first + batch))
            replies += await asyncio.gather(*(one(api, workload, i) for i in wave))
    after = _drafts((await scrape({"w": url}))["w"])
    drafts, drafted, accepted = (a - b for a, b in zip(after, before, strict=True))
    rates = [r.rate for r in replies if r.rate is not None]
    return {"replies": [asdict(r) for r in replies],
            "rate_p50": statistics.median(rates) if rates else None,
            "acceptance_rate": accepted / drafted if drafted else None,
            "tokens_per_drafting_step": 1 + accepted / drafts if drafts else None,
            "failed": sum(r.error is not None for r in replies)}  # fmt: skip


async def slo_run(url: str, schedule: list[tuple[float, str, int]]) -> dict[str, Any]:
    """The open-loop schedule (arrival offset, workload, index) against one worker."""
    async with client(url) as api:
        start = time.monotonic()

        async def at(offset: float, workload: str, i: int) -> Reply:
            await asyncio.sleep(max(0.0, start + offset - time.monotonic()))  # the arrival
            return await one(api, workload, i)

        replies = await asyncio.gather(*(at(*item) for item in schedule))
    ttfts = sorted(r.ttft for r in replies if r.ttft is not None)
    rates = [r.rate for r in replies if r.rate is not None]
    return {"replies": [asdict(r) for r in replies],
            "ttft_p90": ttfts[int(0.9 * (len(ttfts) - 1))] if ttfts else None,
            "below_t": sum(rate < SLO_T for rate in rates) / len(rates) if rates else None,
            "failed": sum(r.error is not None for r in replies)}  # fmt: skip


def _texts(run: dict[str, Any]) -> list[str]:
    return [r["text"] for r in sorted(run["replies"], key=lambda r: r["index"])]


def _start(name: str, extra: list[str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "genpool_worker.worker_cli", "--model", MODEL,
           "--host", WORKERS[name], "--port", str(WORKER_PORT), *WORKER_ARGS, *FLAGS[name],
           *extra]  # fmt: skip
    log = open(LOG.format(name=name), "w")  # noqa: SIM115 (the worker's own log)
    return pinned(cmd, WORKER_CORE, stdout=log, stderr=subprocess.STDOUT)


def _serve(extra: list[str], work: Any) -> Any:
    urls = {name: f"http://{host}:{WORKER_PORT}" for name, host in WORKERS.items()}
    procs = {name: _start(name, extra) for name in WORKERS}
    try:
        wait_ready(procs, urls, LOG)
        return work(urls)
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=60)


def speed(urls: dict[str, str], reps: int, count: int) -> dict[str, Any]:
    cases: dict[str, Any] = {}
    for workload in ("code", "summary", "chat"):
        for batch in (1, 8):
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in WORKERS}
            for rep in range(reps):
                for name in list(WORKERS)[:: 1 if rep % 2 == 0 else -1]:
                    runs[name].append(asyncio.run(speed_run(urls[name], workload, batch,
                                                            count)))  # fmt: skip
            cases[f"{workload}_batch{batch}"] = _case(runs)
    return cases


def _case(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One workload at one batch: every setup's runs, each drafting setup (those besides
    plain) paired with plain rep by rep."""
    drafting = [name for name in runs if name != "plain"]
    pairs = {name: list(zip(runs["plain"], runs[name], strict=True)) for name in drafting}
    return {
        "rate_p50": {name: [r["rate_p50"] for r in rs] for name, rs in runs.items()},
        "ratio_over_plain": {name: [d["rate_p50"] / p["rate_p50"] for p, d in pairs[name]
                                    if p["rate_p50"] and d["rate_p50"]] for name in drafting},
        "acceptance_rate": {name: [r["acceptance_rate"] for r in runs[name]]
                            for name in drafting},
        "tokens_per_drafting_step": {name: [r["tokens_per_drafting_step"] for r in runs[name]]
                                     for name in drafting},
        "texts_equal": all(_texts(p) == _texts(d) for name in drafting for p, d in pairs[name]),
        "failed": sum(r["failed"] for rs in runs.values() for r in rs),
        "runs": runs,
    }  # fmt: skip


def slo(urls: dict[str, str], requests: int) -> dict[str, Any]:
    draw = random.Random(0)
    offset, schedule = 0.0, []
    for i in range(requests):
        offset += draw.expovariate(SLO_RATE)
        schedule.append((offset, ("code", "summary", "chat")[i % 3], i))
    out = {}
    for name in WORKERS:
        out[name] = asyncio.run(slo_run(urls[name], schedule))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run, to /tmp")
    parser.add_argument("--reps", type=int, default=2)
    ns = parser.parse_args(argv)
    os.sched_setaffinity(0, {CLIENT_CORE})
    reps, count = (1, 8) if ns.quick else (ns.reps, 8)
    cases = _serve([], lambda urls: speed(urls, reps, count))
    slo_result = _serve(SLO_ARGS, lambda urls: slo(urls, 9 if ns.quick else SLO_REQUESTS))
    summary = {case: {k: v for k, v in c.items() if k != "runs"} for case, c in cases.items()}
    summary["slo"] = {name: {k: v for k, v in r.items() if k != "replies"}
                      for name, r in slo_result.items()}  # fmt: skip
    setup = {"specs": SPECS, "reply_tokens": REPLY_TOKENS, "requests_per_run": count,
             "slo_t": SLO_T, "slo_rate": SLO_RATE, "slo_args": SLO_ARGS}  # fmt: skip
    result = {**provenance("bench.speculative", argv), "summary": summary, "setup": setup,
              "cases": cases, "slo": slo_result}  # fmt: skip
    path = QUICK_RESULTS if ns.quick else RESULTS
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps(summary, indent=1))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
