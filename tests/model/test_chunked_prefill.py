"""Chunked prefill's greedy text equals whole prefill's (issue 25 item 6); identical
prompts admitted together share one prefill and decode what each would alone.

The model: a prompt run in chunks of 7 (``prefill(..., start)``) into scattered blocks
decodes exactly the tokens of the same prompt prefilled whole. The runner under the
scheduler: requests of 30..100 tokens prefilled 7 tokens a pass, while others decode,
produce the tokens they produce with whole prefills.
"""

from __future__ import annotations

from typing import Any

from genpool_core.kv_blocks import KVBudget
from genpool_core.preemption import GenCapacity
from genpool_core.scheduler import GenScheduler, SchedulerConfig
from genpool_worker.engine_io import Arrival
from genpool_worker.model_runner import TorchModelRunner
from tests.model.paged import BlockPool

CHUNK = 7
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


def _decode_greedy(model: Any, blocks: list[int], prompt: list[int], first: int) -> list[int]:
    out = [first]
    while len(out) < NEW_TOKENS:
        position = len(prompt) + len(out) - 1
        out.append(int(model.decode([blocks], [out[-1]], [position])[0].argmax()))
    return out


def test_chunked_prefill_text_equals_whole(model: Any, tokenizer: Any) -> None:
    pool = BlockPool.of(model, seed=5)
    for prompt in _prompts(tokenizer):
        blocks = pool.table(len(prompt) + NEW_TOKENS)
        whole = _decode_greedy(model, blocks, prompt, int(model.prefill(blocks, prompt).argmax()))
        for start in range(0, len(prompt), CHUNK):
            logits = model.prefill(blocks, prompt[start : start + CHUNK], start)
        chunked = _decode_greedy(model, blocks, prompt, int(logits.argmax()))
        assert chunked == whole, (len(prompt), tokenizer.decode(chunked), tokenizer.decode(whole))
        pool.give_back(blocks)


def _serve(
    model: Any, prompts: list[list[int]], budget: int | None, per_pass: int = 1
) -> tuple[dict[str, list[int]], int]:
    """Every request through GenScheduler and TorchModelRunner, ``per_pass`` arriving each
    pass: each request's tokens, and the prompt tokens the runner did not recompute."""
    scheduler = GenScheduler.from_settings(
        {},
        GenCapacity(max_batch_size=4),
        SchedulerConfig(
            kv_budget=KVBudget(model.num_blocks, model.block_size),
            max_prefill_tokens_per_pass=budget,
        ),
    )
    runner = TorchModelRunner(model)
    out: dict[str, list[int]] = {}
    num_shared = 0
    now, pending = 0.0, [(f"r{i}", p) for i, p in enumerate(prompts)]
    while pending or scheduler.num_residents or scheduler.num_waiting:
        for request_id, prompt in pending[:per_pass]:
            arrival = Arrival(request_id, prompt, NEW_TOKENS, arrival_time=now)
            scheduler.add_request(arrival.gen_request(now), now)
            runner.add_request(arrival)
            out[request_id] = []
        del pending[:per_pass]
        plan = scheduler.step(now)
        for request_id in plan.finished_ids:
            runner.remove_request(request_id)
        result = runner.execute(plan) if plan.batch_ids or plan.prefill_chunks else None
        tokens = result.tokens if result else {}
        num_shared += result.num_shared_prefill_tokens if result else 0
        assert set(tokens) == set(plan.batch_ids)
        for request_id, token in tokens.items():
            out[request_id].append(token)
        scheduler.postprocess(plan, now + 0.01)
        now += 0.02
    return out, num_shared


def test_runner_chunked_prefill_text_equals_whole(model: Any, tokenizer: Any) -> None:
    prompts = _prompts(tokenizer) * 2
    whole, _ = _serve(model, prompts, None)
    chunked, _ = _serve(model, prompts, CHUNK)
    assert all(len(tokens) == NEW_TOKENS for tokens in whole.values())
    assert chunked == whole


def test_identical_prompts_admitted_together_share_one_prefill(model: Any, tokenizer: Any) -> None:
    """``n`` choices: three copies of a prompt and one other arrive in one pass; the
    copies' KV is one prefill copied into their own blocks, and each decodes the tokens
    the prompt decodes alone (the copies then write only their own blocks)."""
    shared_prompt, other = _prompts(tokenizer)[1:3]
    alone, saved_alone = _serve(model, [shared_prompt, other], None)
    together, saved = _serve(model, [shared_prompt, other, shared_prompt, shared_prompt],
                             None, per_pass=4)  # fmt: skip
    assert saved_alone == 0 and saved == 2 * len(shared_prompt)
    assert together["r0"] == together["r2"] == together["r3"] == alone["r0"]
    assert together["r1"] == alone["r1"]


def test_identical_prompts_prefilled_in_chunks_copy_what_a_twin_has(
    model: Any, tokenizer: Any
) -> None:
    """The same with a budget of 7 tokens a pass: the first copy is prefilled whole
    (nobody decodes yet); the later copies' chunks, one after the other beside it
    decoding, copy the blocks of a copy still resident, and each recomputes only its
    prompt's last position (the logits it copies from are an earlier pass's). A prompt's
    copy that finished is no twin: what it had is gone."""
    shared_prompt, other = _prompts(tokenizer)[1:3]
    alone, _ = _serve(model, [shared_prompt, other], None)
    together, saved = _serve(model, [shared_prompt, shared_prompt, shared_prompt, other],
                             CHUNK, per_pass=4)  # fmt: skip
    assert saved == 2 * (len(shared_prompt) - 1)
    assert together["r0"] == together["r1"] == together["r2"] == alone["r0"]
    assert together["r3"] == alone["r1"]
