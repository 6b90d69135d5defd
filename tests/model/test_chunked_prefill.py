"""Chunked prefill's greedy text equals whole prefill's (issue 25 item 6); prompts that
share a prefix share its cached blocks (issue 34) and decode what each would alone.

The passes: a prompt run in chunks of 11 (``prefill(..., start)``) into scattered blocks
decodes exactly the tokens of the same prompt prefilled whole. The runner under the
scheduler: requests of 30..100 tokens prefilled 11 tokens a pass, while others decode,
produce the tokens they produce with whole prefills; with prefix caching, prompts that
share a prefix hold its cached blocks and decode the same text.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from genpool_core.block_hash import block_hashes
from genpool_core.kv_blocks import KVBudget
from genpool_core.preemption import GenCapacity
from genpool_core.scheduler import GenScheduler, SchedulerConfig
from genpool_worker.engine_io import Arrival
from genpool_worker.model import PrefillSpan
from genpool_worker.model_runner import TorchModelRunner
from tests.model.paged import BlockPool

CHUNK = 11  # no divisor of the block size (16) nor of any prompt length
NEW_TOKENS = 12
TEXT = (
    "The history of the Roman Empire begins with the founding of the city, and over "
    "many centuries its roads, laws and languages spread across Europe, North Africa "
    "and the Near East, shaping the cities, the trade and the politics of everything "
    "that came after it, from the Middle Ages to the present day in many countries. "
    "Historians still argue about why it fell: some blame the economy and the army, "
    "others the division into east and west, the migrations of new peoples, plagues, "
    "civil wars between rival generals, or simply the sheer size of the territory that "
    "a government in Rome, and later in Constantinople, tried to hold together."
)


def _prompts(tokenizer: Any) -> list[list[int]]:
    ids = tokenizer.encode(TEXT)
    assert len(ids) >= 100
    return [ids[:30], ids[:47], ids[:71], ids[:100]]


def _decode_greedy(runner: Any, blocks: list[int], prompt: list[int], first: int) -> list[int]:
    out = [first]
    while len(out) < NEW_TOKENS:
        position = len(prompt) + len(out) - 1
        out.append(int(runner.decode([blocks], [out[-1]], [position])[0].argmax()))
    return out


def test_chunked_prefill_text_equals_whole(runner: Any, tokenizer: Any) -> None:
    pool = BlockPool.of(runner, seed=5)
    for prompt in _prompts(tokenizer):
        blocks = pool.table(len(prompt) + NEW_TOKENS)
        whole = _decode_greedy(runner, blocks, prompt, int(runner.prefill(blocks, prompt).argmax()))
        for start in range(0, len(prompt), CHUNK):
            logits = runner.prefill(blocks, prompt[start : start + CHUNK], start)
        chunked = _decode_greedy(runner, blocks, prompt, int(logits.argmax()))
        assert chunked == whole, (len(prompt), tokenizer.decode(chunked), tokenizer.decode(whole))
        pool.give_back(blocks)


def _serve(
    base: Any, prompts: list[list[int]], budget: int | None, per_pass: int = 1,
    *, caching: bool = False,
) -> tuple[dict[str, list[int]], int]:  # fmt: skip
    """Every request through GenScheduler and a fresh TorchModelRunner over ``base``'s
    network and cache, ``per_pass`` arriving each pass: each request's tokens, and the
    prompt tokens the prefix cache held."""
    scheduler = GenScheduler.from_settings(
        {},
        GenCapacity(max_batch_size=4),
        SchedulerConfig(
            kv_budget=KVBudget(base.kv.num_blocks, base.kv.block_size),
            max_prefill_tokens_per_pass=budget,
            enable_prefix_caching=caching,
        ),
    )
    runner = TorchModelRunner(base.model, base.kv)
    out: dict[str, list[int]] = {}
    now, pending = 0.0, [(f"r{i}", p) for i, p in enumerate(prompts)]
    while pending or scheduler.num_residents or scheduler.num_waiting:
        for request_id, prompt in pending[:per_pass]:
            arrival = Arrival(request_id, prompt, NEW_TOKENS, arrival_time=now)
            hashes = block_hashes(prompt, runner.info.kv_block_size)
            scheduler.add_request(arrival.gen_request(now, hashes), now)
            runner.add_request(arrival)
            out[request_id] = []
        del pending[:per_pass]
        plan = scheduler.step(now)
        for request_id in plan.finished_ids:
            runner.remove_request(request_id)
        result = runner.execute(plan) if plan.batch_ids or plan.prefill_chunks else None
        tokens = result.tokens if result else {}
        assert set(tokens) == set(plan.batch_ids) and not (result and result.failed)
        for request_id, token in tokens.items():
            out[request_id].append(token)
        scheduler.postprocess(plan, now + 0.01)
        now += 0.02
    return out, scheduler.kv.num_hit_tokens


def test_runner_chunked_prefill_text_equals_whole(runner: Any, tokenizer: Any) -> None:
    prompts = _prompts(tokenizer) * 2
    whole, _ = _serve(runner, prompts, None)
    chunked, _ = _serve(runner, prompts, CHUNK)
    assert all(len(tokens) == NEW_TOKENS for tokens in whole.values())
    assert chunked == whole


@pytest.mark.parametrize("budget", [None, CHUNK])
def test_prefix_caching_shares_prompts_and_decodes_the_same_text(
    runner: Any, tokenizer: Any, budget: int | None
) -> None:
    """Prompts that extend one another (a conversation's turns) and repeat, one arriving
    each pass: with caching each later prompt's leading full blocks come from the cache
    and its prefill (whole, or in chunks of 11) starts after them; greedy text equal."""
    prompts = [*_prompts(tokenizer), *_prompts(tokenizer)[::-1]]
    plain, none = _serve(runner, prompts, budget)
    cached, hits = _serve(runner, prompts, budget, caching=True)
    assert none == 0 and hits >= 2 * runner.kv.block_size
    assert cached == plain


def test_identical_prompts_admitted_together_share_the_first_ones_blocks(
    runner: Any, tokenizer: Any
) -> None:
    """``n`` choices: three copies of a prompt and one other arrive in one pass; the
    later copies hold the first copy's full blocks (computed earlier in the same pass),
    compute only the prompt's last partial block, and decode what the prompt decodes
    alone (then write only their own blocks)."""
    shared_prompt, other = _prompts(tokenizer)[1:3]
    alone, _ = _serve(runner, [shared_prompt, other], None, caching=True)
    together, hits = _serve(runner, [shared_prompt, other, shared_prompt, shared_prompt],
                            None, per_pass=4, caching=True)  # fmt: skip
    full = (len(shared_prompt) - 1) // runner.kv.block_size * runner.kv.block_size
    assert hits == 3 * full  # the two copies, and the other prompt (it starts the same)
    assert together["r0"] == together["r2"] == together["r3"] == alone["r0"]
    assert together["r1"] == alone["r1"]


def test_prompts_prefilled_in_one_forward_equal_each_alone(runner: Any, tokenizer: Any) -> None:
    """``prefill_many``: one forward over a whole prompt, another's later chunk (reading
    its earlier chunk's KV back) and a third prompt gives each one's logits and KV as
    its own forward does."""
    pool = BlockPool.of(runner, seed=11)
    prompts = _prompts(tokenizer)[:3]
    tables = [pool.table(len(p) + NEW_TOKENS) for p in prompts]
    spans = [PrefillSpan(tables[0], prompts[0]), PrefillSpan(tables[1], prompts[1][CHUNK:], CHUNK),
             PrefillSpan(tables[2], prompts[2])]  # fmt: skip
    runner.prefill(tables[1], prompts[1][:CHUNK])
    together = runner.model.prefill_many(runner.kv.cache, spans)
    kv_together = [t.clone() for t in (runner.kv.cache.k[-1], runner.kv.cache.v[-1])]
    for span, logits in zip(spans, together, strict=True):
        alone = runner.prefill(span.blocks, list(span.token_ids), span.start)
        torch.testing.assert_close(logits, alone, rtol=1e-4, atol=1e-4)
    for kv, before in zip((runner.kv.cache.k[-1], runner.kv.cache.v[-1]), kv_together, strict=True):
        torch.testing.assert_close(kv, before, rtol=1e-4, atol=1e-4)
