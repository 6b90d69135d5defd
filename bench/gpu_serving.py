"""GPU check of the serving path: a real ``genpool-worker`` on CUDA, driven over HTTP.

One command, one JSON (``bench/results/gpu_serving.json``), ~2-3 minutes on an H200:

    python -m bench.gpu_serving            # or: python3 bench/gpu_check.py --serving
    python -m bench.gpu_serving --smoke    # tiny shape on the CPU, ~30 s: proves the script

1. The model: a Hugging Face checkpoint directory with random bf16 weights at
   Llama-3.1-8B shape (all 32 layers, 16 GB; ``--layers`` fewer, same width) and a
   word-level tokenizer, written on the fly (``gpu_check_checkpoint``): the worker has
   no random-weights model, and a checkpoint directory is what it serves in production.
2. Model only: ours loaded in this process from that directory, greedy decode timed at
   each concurrency as a batch (``gpu_check.ours_decode``: prompt 128, 256 steps after a
   warm-up), then freed.
3. Serving: ``genpool-worker --model DIR --device cuda`` (its own process, loopback
   HTTP), then for each concurrency 1, 64, 128 a short warm-up wave (its CUDA graphs)
   and a measured wave: that many streaming ``AsyncOpenAI`` completions sent at once
   (prompt 128 random ids, exactly 256 tokens: ``min_tokens``), from client processes
   of 16 streams each (``gpu_check_clients``). Output tokens/s over the wave and in its
   steady window (every stream decoding), against the model-only figure at the same
   batch (goal: >= 90 % at 64, steady window); TTFT p50/p90; the engine's model time
   from ``/metrics`` (``genpool_step_seconds``).
4. Sampling on the device: temperature 0.8 (+ top_p 0.9 unless ``--no-top-p``) with a
   seed, twice: both must succeed and give the same text (and another seed another).
   A refused parameter is recorded as the request's error, not raised.

Every phase has a timeout (an alarm, a subprocess or HTTP timeout) and records its
error in the JSON; the next phase still runs where it can.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import torch

from bench.decode_support import Ours
from bench.gpu_check import Budget, environment, measure, ours_decode
from bench.gpu_check_checkpoint import prompt_range, scratch_dir, write_checkpoint
from bench.gpu_check_clients import (
    one_stream,
    run_clients,
    sampling_summary,
    sdk,
    serving_table,
    split,
    summarize_wave,
)
from bench.gpu_check_models import LLAMA31_8B, SEED, TINY
from bench.gpu_check_worker import LOG as WORKER_LOG
from bench.gpu_check_worker import engine_model_time, worker_process
from bench.provenance import provenance
from genpool_core.model_catalogue import kv_bytes_per_token
from genpool_core.names import DEFAULT_KV_BLOCK_SIZE

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench/results/gpu_serving.json"
SMOKE_RESULTS = Path(tempfile.gettempdir()) / "genpool-gpu-serving-smoke.json"
GOAL_AT, GOAL = 64, 0.9
T = TypeVar("T")


@dataclass(frozen=True)
class Settings:
    smoke: bool
    device: str
    shape: dict[str, Any]
    concurrency: tuple[int, ...]
    prompt_len: int = 128
    output_len: int = 256
    warm_tokens: int = 16
    sample_tokens: int = 32
    top_p: float | None = 0.9
    per_process: int = 16
    phase_timeout_s: float = 180.0
    budget_s: float = 250.0  # with gpu_check's 300 s: both checks in under 10 min

    @property
    def max_seq_len(self) -> int:
        return self.prompt_len + self.output_len + DEFAULT_KV_BLOCK_SIZE

    @property
    def model(self) -> str:
        return "llama-3.1-8b-shape-random" if not self.smoke else "tiny-random"


def settings(args: argparse.Namespace) -> Settings:
    top_p = None if args.no_top_p else args.top_p
    if args.smoke:
        return Settings(True, args.device or "cpu", TINY, (1, 4), prompt_len=16, output_len=16,
                        warm_tokens=4, sample_tokens=8, top_p=top_p, per_process=2,
                        phase_timeout_s=90.0)  # fmt: skip
    shape = LLAMA31_8B | {"num_hidden_layers": args.layers}
    concurrency = tuple(int(c) for c in args.concurrency.split(","))
    return Settings(False, args.device or "cuda", shape, concurrency, top_p=top_p)


def alarmed(seconds: float, fn: Callable[[], T]) -> Callable[[], T]:
    """``fn`` that raises TimeoutError once it has run ``seconds`` (SIGALRM)."""

    def run() -> T:
        def expire(signum: int, frame: Any) -> None:
            raise TimeoutError(f"phase still running after {seconds:.0f} s")

        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return fn()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    return run


def model_only(directory: Path, s: Settings) -> dict[str, Any]:
    """Ours from ``directory`` in this process: decode tok/s at each concurrency."""
    from genpool_worker.model import CacheEngine, KVSizing, LlamaModel

    biggest = max(s.concurrency)
    model = LlamaModel.from_hf_dir(directory, max_seq_len=s.max_seq_len, device=s.device)
    sizing = KVSizing(DEFAULT_KV_BLOCK_SIZE, biggest * -(-s.max_seq_len // DEFAULT_KV_BLOCK_SIZE))
    ours = Ours.of(model, CacheEngine(model, sizing, max_decode_batch=biggest))
    try:
        out = {f"b{b}": ours_decode(ours, b, s.prompt_len, s.output_len) for b in s.concurrency}
        return out | {"uses_cuda_graphs": ours.kv.uses_cuda_graphs, "dtype": str(model.dtype)}
    finally:
        del ours, model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def worker_command(directory: Path, s: Settings) -> list[str]:
    """``genpool-worker`` serving ``directory`` at ``s``'s batch and length."""
    cmd = ["--model", str(directory), "--device", s.device, "--max-batch-size",
           str(max(s.concurrency)), "--max-seq-len", str(s.max_seq_len)]  # fmt: skip
    if s.device.startswith("cuda"):  # room for twice the largest wave, not 90 % of the GPU
        layers, kv_heads = s.shape["num_hidden_layers"], s.shape["num_key_value_heads"]
        head_dim = s.shape["hidden_size"] // s.shape["num_attention_heads"]
        per_token = kv_bytes_per_token(layers, kv_heads, head_dim, 2)
        cmd += ["--kv-cache-memory", str(2 * max(s.concurrency) * s.max_seq_len * per_token)]
    return cmd


def prompts(s: Settings, count: int, seed: int) -> list[list[int]]:
    rng, (low, high) = random.Random(seed), prompt_range(s.shape)
    return [[rng.randrange(low, high) for _ in range(s.prompt_len)] for _ in range(count)]


def wave(url: str, s: Settings, concurrency: int, max_tokens: int) -> dict[str, Any]:
    """``concurrency`` streams sent at once from client processes; their summary."""
    groups = split(prompts(s, concurrency, SEED + concurrency), s.per_process)
    specs = [{"url": url, "model": s.model, "prompts": group, "max_tokens": max_tokens,
              "timeout_s": s.phase_timeout_s} for group in groups]  # fmt: skip
    before = engine_model_time(url)
    records, start_at = run_clients(specs, s.phase_timeout_s + 30)
    after = engine_model_time(url)
    summary = summarize_wave(records)
    engine_s, passes = after[0] - before[0], after[1] - before[1]
    return summary | {
        "concurrency": concurrency, "max_tokens": max_tokens, "client_processes": len(groups),
        "send_spread_s": max(r.sent for r in records) - start_at,
        "engine_passes": passes, "engine_model_s": engine_s,
        "engine_model_share": engine_s / summary["wall_s"] if summary.get("wall_s") else None,
    }  # fmt: skip


async def sampling(url: str, s: Settings) -> dict[str, Any]:
    """Seeded sampling twice per variant (and another seed, and greedy), one at a time."""
    client = sdk(url, s.phase_timeout_s)
    prompt, n = prompts(s, 1, SEED)[0], s.sample_tokens
    variants: dict[str, dict[str, Any]] = {"temperature": {"temperature": 0.8}}
    if s.top_p is not None:
        variants["temperature_top_p"] = {"temperature": 0.8, "top_p": s.top_p}
    out: dict[str, Any] = {}
    try:
        greedy = await one_stream(client, s.model, prompt, n)
        for name, params in variants.items():
            runs = [await one_stream(client, s.model, prompt, n, seed=seed, **params)
                    for seed in (1234, 1234, 4321)]  # fmt: skip
            out[name] = sampling_summary(params | {"seed": 1234}, runs, greedy)
    finally:
        await client.close()
    return out


def serve(directory: Path, s: Settings) -> dict[str, Any]:
    """The worker on ``directory``: the waves at each concurrency, then sampling."""
    result: dict[str, Any] = {"worker_log": str(WORKER_LOG)}
    budget = Budget(s.phase_timeout_s * (len(s.concurrency) + 2))
    started = time.perf_counter()
    with worker_process(worker_command(directory, s), s.phase_timeout_s) as url:
        result["worker_ready_s"] = time.perf_counter() - started
        for c in s.concurrency:
            measure(result, f"warmup_c{c}", budget, 1, partial(wave, url, s, c, s.warm_tokens))
            measure(result, f"c{c}", budget, 1, partial(wave, url, s, c, s.output_len))

        def run_sampling() -> dict[str, Any]:
            return asyncio.run(asyncio.wait_for(sampling(url, s), s.phase_timeout_s))

        measure(result, "sampling", budget, 1, run_sampling)
    return result


def run(s: Settings) -> dict[str, Any]:
    device = torch.device(s.device)
    result: dict[str, Any] = {"settings": asdict(s) | {"max_seq_len": s.max_seq_len},
                              "environment": environment(device)}  # fmt: skip
    budget = Budget(s.budget_s)
    with tempfile.TemporaryDirectory(dir=scratch_dir(s.shape)) as tmp:
        directory = Path(tmp) / s.model
        write = partial(write_checkpoint, directory, s.shape, device, SEED)
        if measure(result, "checkpoint", budget, 5, alarmed(s.phase_timeout_s, write)) is None:
            return result
        only = partial(model_only, directory, s)
        measure(result, "model_only", budget, 10, alarmed(s.phase_timeout_s, only))
        measure(result, "serving", budget, 20, partial(serve, directory, s))
    result["table"] = serving_table(result, s.concurrency)
    goal = next((r for r in result["table"] if r["concurrency"] == GOAL_AT), None)
    ratio = goal.get("steady_ratio") if goal else None
    result["goal"] = {"concurrency": GOAL_AT, "min_ratio": GOAL, "steady_ratio": ratio,
                      "met": None if ratio is None else ratio >= GOAL}  # fmt: skip
    return result


def format_summary(result: dict[str, Any]) -> str:
    s = result["settings"]
    gpu, layers = result["environment"].get("gpu", ""), s["shape"]["num_hidden_layers"]
    lines = [f"gpu_serving: {s['device']} {gpu}, {layers} layers" + ("  [SMOKE]" * s["smoke"])]
    for row in result.get("table", []):
        lines.append(
            f"c={row['concurrency']}: model only {_f(row['model_only_tok_s'])} tok/s; serving "
            f"steady {_f(row['steady_tok_s'])} (x{_f(row['steady_ratio'], 3)}), whole wave "
            f"{_f(row['wall_tok_s'])} (x{_f(row['wall_ratio'], 3)}); TTFT p50 "
            f"{_f(row['ttft_p50_ms'])} ms, p90 {_f(row['ttft_p90_ms'])} ms"
        )
    lines.append(f"goal: {result.get('goal')}")
    lines.append(f"sampling: {json.dumps(result.get('serving', {}).get('sampling'))[:600]}")
    errors = [k for k, v in _phases(result) if isinstance(v, dict) and "error" in v]
    lines.append(f"errors: {errors or 'none'}; total {result.get('total_s', 0):.0f} s")
    return "\n".join(lines)


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _phases(result: dict[str, Any]) -> list[tuple[str, Any]]:
    serving = result.get("serving", {})
    return [*result.items(), *(serving.items() if isinstance(serving, dict) else [])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shape on the CPU")
    parser.add_argument("--out", default=None, help=f"default {RESULTS} (smoke: {SMOKE_RESULTS})")
    parser.add_argument("--device", default=None, help="default cuda (smoke: cpu)")
    parser.add_argument("--layers", type=int, default=32, help="Llama-3.1-8B's 32, or fewer")
    parser.add_argument("--concurrency", default="1,64,128", help="streams per wave, a,b,...")
    parser.add_argument("--top-p", type=float, default=0.9, help="the sampling check's top_p")
    parser.add_argument("--no-top-p", action="store_true", help="sample without top_p")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    source = provenance("bench.gpu_serving", argv)  # the tree at start (bench/freshness.py)
    result = source | run(settings(args))
    result["total_s"] = time.perf_counter() - start
    out = Path(args.out or (SMOKE_RESULTS if args.smoke else RESULTS))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(format_summary(result))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
