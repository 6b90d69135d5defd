"""Block tables for the model tests: scattered on purpose, so every test pages for real.

The worker's pool (``genpool_core.kv_blocks``) hands out the lowest free ids, so on a
fresh worker each request's table is one ascending run and a test built on that would
pass with a model that mixes up table order and block ids, or that assumes a request's
blocks adjacent. Here the free list is shuffled with a fixed seed, requests take blocks
one at a time as their tokens cross a block boundary (so the tables of requests decoded
together interleave), and a finished request's blocks go to the front of the free list:
the next admission reuses them, stale KV included. Tests pick block sizes (5, 16) that do
not divide their prompt lengths. ``BlockPool(..., seed=None)`` instead hands blocks out
in order: with ``block_size = max_seq_len`` that is the static, pre-paging layout (one
block per request, consecutive), whose decode reads K/V in place.

``run_with_pauses`` is the shared schedule of the greedy-equality tests: requests admitted
as others finish (reusing their blocks), some paused in place for a few steps (their
blocks checked bit-for-bit on resume), rows in a rotating order, dummy padding rows.

The helpers take a runner (``paged_runner``: a network, a KV cache for it, and the
worker's ``TorchModelRunner`` over both): its ``prefill`` and ``decode`` are the passes
the engine runs, its ``kv`` the cache.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from genpool_worker.model import CacheEngine, KVSizing, LlamaModel
from genpool_worker.model_runner import TorchModelRunner

SIZING_OPTIONS = ("block_size", "num_blocks", "kv_cache_memory", "gpu_memory_utilization")
ENGINE_OPTIONS = ("max_decode_batch", "cuda_graphs", "in_place_decode")


def paged_runner(
    model: LlamaModel, num_blocks: int, block_size: int, **engine: Any
) -> TorchModelRunner[Any]:
    """``model`` over a cache of exactly ``num_blocks`` blocks of ``block_size`` tokens;
    ``engine``: ``CacheEngine``'s other options."""
    return TorchModelRunner(model, CacheEngine(model, KVSizing(block_size, num_blocks), **engine))


def llama_runner(
    load: Callable[..., LlamaModel], *args: Any, **options: Any
) -> TorchModelRunner[Any]:
    """``load(*args, **network options)`` (``LlamaModel`` or one of its loaders) over a
    cache sized by ``options``' ``KVSizing`` fields and built with its ``CacheEngine``
    ones, behind a runner: the worker's ``build_model`` in one call, the sizing checked
    before any weight is placed, as there."""
    sizing = KVSizing(**{key: options.pop(key) for key in SIZING_OPTIONS if key in options})
    engine = {key: options.pop(key) for key in ENGINE_OPTIONS if key in options}
    model = load(*args, **options)
    return TorchModelRunner(model, CacheEngine(model, sizing, **engine))


class BlockPool:
    """Free block ids of a model's cache: shuffled (``seed``) or in order (``None``)."""

    def __init__(self, num_blocks: int, block_size: int, *, seed: int | None = 0) -> None:
        self.block_size = block_size
        self._free = list(range(num_blocks))
        if seed is not None:
            random.Random(seed).shuffle(self._free)
        self.released: set[int] = set()  # blocks a finished request has held

    @classmethod
    def of(cls, runner: Any, *, seed: int | None = 0) -> BlockPool:
        return cls(runner.kv.num_blocks, runner.kv.block_size, seed=seed)

    def blocks_for(self, num_tokens: int) -> int:
        return max(1, -(-num_tokens // self.block_size))

    def take(self, count: int) -> list[int]:
        if count > len(self._free):
            raise RuntimeError(f"{count} KV blocks asked, {len(self._free)} free: a bigger cache")
        taken, self._free = self._free[:count], self._free[count:]
        return taken

    def table(self, num_tokens: int) -> list[int]:
        """A table for ``num_tokens`` tokens at once."""
        return self.take(self.blocks_for(num_tokens))

    def give_back(self, blocks: Sequence[int]) -> None:
        """To the front, in table order: the next request gets them, at the same offsets."""
        self._free[:0] = blocks
        self.released.update(blocks)


def interleaved_tables(
    num_blocks: int, block_size: int, token_counts: Sequence[int], *, seed: int = 0
) -> list[list[int]]:
    """Tables for requests of ``token_counts`` tokens, their blocks dealt round-robin from
    a shuffled free list (so no table is a run and the requests' blocks alternate)."""
    pool = BlockPool(num_blocks, block_size, seed=seed)
    need = [pool.blocks_for(n) for n in token_counts]
    tables: list[list[int]] = [[] for _ in token_counts]
    for round_ in range(max(need)):
        for table, n in zip(tables, need, strict=True):
            if round_ < n:
                table.extend(pool.take(1))
    return tables


def dummy_row(runner: Any) -> list[int]:
    """A batch-padding row's table (decoded at position 0)."""
    return [runner.kv.dummy_block]


def block_kv(runner: Any, blocks: Sequence[int]) -> list[torch.Tensor]:
    """Copies of ``blocks``' K and V in every layer."""
    cache = runner.kv.cache
    return [t[:, list(blocks)].clone() for t in (*cache.k, *cache.v)]


def same_kv(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def greedy(
    runner: Any, blocks: Sequence[int], prompt: list[int], new_tokens: int, *, pad: bool = False
) -> list[int]:
    """One request alone: prefill into ``blocks``, then batch-1 (or, with ``pad``, a dummy
    padding row too) greedy decode steps; ``new_tokens`` tokens, stopping at EOS."""
    out = [int(runner.prefill(blocks, prompt).argmax())]
    while len(out) < new_tokens and out[-1] != runner.model.eos_token_id:
        tables = [list(blocks)] + ([dummy_row(runner)] if pad else [])
        tokens, positions = [out[-1]] + [0] * pad, [len(prompt) + len(out) - 1] + [0] * pad
        out.append(int(runner.decode(tables, tokens, positions)[0].argmax()))
    return out


@dataclass
class Request:
    prompt: list[int]
    blocks: list[int]
    out: list[int] = field(default_factory=list)
    resume_at: int | None = None  # the step it resumes at, while paused
    paused_at: int = 0
    paused_kv: list[torch.Tensor] | None = None

    @property
    def position(self) -> int:
        """Where the last token (the next decode input) goes."""
        return len(self.prompt) + len(self.out) - 1


@dataclass
class RunLog:
    steps: int = 0
    pauses: int = 0  # pauses ended with the request's blocks checked bit-for-bit
    reused: int = 0  # admissions that got a finished request's blocks
    padded_steps: int = 0
    grown: int = 0  # blocks taken mid-decode


def run_with_pauses(
    runner: Any,
    pool: BlockPool,
    prompts: Sequence[list[int]],
    new_tokens: int,
    *,
    concurrency: int = 3,
    pause_after: int = 2,
    pause_steps: int = 4,
) -> tuple[list[list[int]], RunLog]:
    """Each prompt's greedy tokens (``new_tokens``, or up to EOS), generated together.

    At most ``concurrency`` requests hold blocks; the next prompt is admitted (prefilled)
    when one finishes, into the blocks it gave back. Every odd-numbered request pauses
    in place once, after ``pause_after`` tokens, for ``pause_steps`` decode calls of the
    others; its blocks must be unchanged when it resumes. Rows are rotated each step and
    ``step % 3`` dummy rows pad the batch. Raises if the run paused, reused or padded
    nothing (the prompts would then not test what the callers claim).
    """
    eos = runner.model.eos_token_id
    waiting = list(enumerate(prompts))
    running: dict[int, Request] = {}
    outputs: dict[int, list[int]] = {}
    log = RunLog()

    def finished(r: Request) -> bool:
        return len(r.out) >= new_tokens or r.out[-1] == eos

    def retire(i: int) -> None:
        r = running.pop(i)
        pool.give_back(r.blocks)
        outputs[i] = r.out

    while waiting or running:
        while waiting and len(running) < concurrency:
            i, prompt = waiting.pop(0)
            blocks = pool.table(len(prompt))
            log.reused += bool(pool.released.intersection(blocks))
            running[i] = r = Request(list(prompt), blocks)
            r.out.append(int(runner.prefill(blocks, r.prompt).argmax()))
            if finished(r):
                retire(i)
        for i, r in running.items():
            if i % 2 == 1 and r.paused_kv is None and len(r.out) == pause_after:
                r.paused_kv, r.paused_at = block_kv(runner, r.blocks), log.steps
                r.resume_at = log.steps + pause_steps
        others_live = any(r.resume_at is None for r in running.values())
        for r in running.values():
            due = r.resume_at is not None and (r.resume_at <= log.steps or not others_live)
            if due and r.paused_kv is not None:
                assert same_kv(r.paused_kv, block_kv(runner, r.blocks)), "paused KV changed"
                r.resume_at = None
                log.pauses += log.steps > r.paused_at  # it missed a decode call at least
        live = [(i, r) for i, r in running.items() if r.resume_at is None]
        if not live:
            continue
        shift = log.steps % len(live)
        live = live[shift:] + live[:shift]
        for _, r in live:
            while r.position // pool.block_size >= len(r.blocks):
                r.blocks += pool.take(1)
                log.grown += 1
        pad = log.steps % 3
        logits = runner.decode(
            [r.blocks for _, r in live] + [dummy_row(runner)] * pad,
            [r.out[-1] for _, r in live] + [0] * pad,
            [r.position for _, r in live] + [0] * pad,
        )
        for (i, r), row in zip(live, logits, strict=False):
            r.out.append(int(row.argmax()))
            if finished(r):
                retire(i)
        log.steps += 1
        log.padded_steps += pad > 0
    assert log.pauses and log.reused and log.padded_steps, f"schedule exercised too little: {log}"
    return [outputs[i] for i in range(len(prompts))], log
