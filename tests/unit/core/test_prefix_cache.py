"""Prefix caching in the scheduler (docs/design.md#prefix-caching): a hit's blocks hold
exactly the request's tokens, admission reserves only what is not cached, prefill starts
after the hit, and pausing and exhaustion lose nothing (the pool itself:
test_prefix_pool.py)."""

from __future__ import annotations

import random

import pytest

from genpool_core.block_hash import block_hashes, extend_hashes
from genpool_core.kv_account import KVAccount
from genpool_core.kv_blocks import (
    KVBudget,
)
from genpool_core.plan import GenPlan
from genpool_core.request import FinishReason, GenRequest, RequestStatus
from genpool_core.scheduler import GenScheduler
from tests.unit.support import check_invariants, make_scheduler

BS = 4  # tokens per block in these tests

# -- the scheduler sharing prompts -------------------------------------------------------


class Writer:
    """The runner's part: writes each scheduled prompt token into its block (block ->
    position -> token), checks a hit's blocks hold the request's own tokens."""

    def __init__(self) -> None:
        self.kv: dict[int, dict[int, int]] = {}
        self.tokens: dict[str, list[int]] = {}

    def run(self, scheduler: GenScheduler, plan: GenPlan) -> None:
        """In plan order: each admission's hit is checked before it (or any later one)
        is prefilled, whole prefills in admission order, then the chunks."""
        whole = set(plan.prefill_ids) - {rid for rid, _, _ in plan.prefill_chunks}
        for request_id, cached in zip(plan.admitted_ids, plan.admitted_cached_tokens,
                                      strict=True):  # fmt: skip
            request, tokens = scheduler.get_request(request_id), self.tokens[request_id]
            for position in range(cached):
                block = request.blocks[position // BS]
                assert self.kv[block][position % BS] == tokens[position], "a hit's KV"
            if request_id in whole:
                self.write(request, cached, request.prompt_len)
        for request_id, start, end in plan.prefill_chunks:
            self.write(scheduler.get_request(request_id), start, end)

    def write(self, request: GenRequest, first: int, last: int) -> None:
        for position in range(first, last):
            block = request.blocks[position // BS]
            self.kv.setdefault(block, {})[position % BS] = self.tokens[request.request_id][position]


def conversation(seed: int, turns: int, system: int) -> list[list[int]]:
    """Each turn's prompt: a shared system prompt, the history, a new message."""
    rng = random.Random(seed)
    history = [1000 + t for t in range(system)]
    prompts = []
    for _ in range(turns):
        history = history + [rng.randrange(50_000) for _ in range(rng.randint(1, 9))]
        prompts.append(list(history))
        history = history + [rng.randrange(50_000) for _ in range(rng.randint(1, 6))]
    return prompts


MODES = [
    {},
    {"tpot_budget": 0.5, "resident_headroom": 4, "paused_cap": 3},
    {"target_output_tps": 20.0, "resident_headroom": 4, "paused_cap": 3},
]


@pytest.mark.parametrize("chunk", [None, 3])
@pytest.mark.parametrize("mode", MODES, ids=["off", "tpot_budget", "target_output_tps"])
def test_conversations_share_their_history_and_exhaustion_loses_nothing(
    mode: dict[str, object], chunk: int | None
) -> None:
    scheduler = make_scheduler(2, mode, target_x=0.4, kv_budget=KVBudget(30, BS),
                               enable_prefix_caching=True,
                               max_prefill_tokens_per_pass=chunk)  # fmt: skip
    writer = Writer()
    prompts = [p for seed in range(6) for p in conversation(seed, 3, system=10)]
    requests = []
    for i, prompt in enumerate(prompts):
        request = GenRequest(f"r{i}", len(prompt), 3 + i % 4, arrival_time=0.05 * i,
                             first_token_time=0.05 * i, num_output_tokens=0,
                             block_hashes=block_hashes(prompt, BS))  # fmt: skip
        writer.tokens[request.request_id] = prompt
        requests.append(request)
    now, arrived, hit_tokens = 0.0, 0, 0
    while arrived < len(requests) or scheduler.num_residents or scheduler.num_waiting:
        while arrived < len(requests) and requests[arrived].arrival_time <= now:  # type: ignore[operator]
            scheduler.add_request(requests[arrived], now)
            arrived += 1
        plan = scheduler.step(now)
        writer.run(scheduler, plan)
        hit_tokens += sum(plan.admitted_cached_tokens)
        scheduler.postprocess(plan, now + 0.05)
        check_invariants(scheduler)
        now += 0.05
        assert now < 300, "the pool did not drain"
    assert hit_tokens > 0 and scheduler.kv.num_hit_tokens == hit_tokens
    assert scheduler.kv.num_queried_tokens == sum(len(p) for p in prompts)
    for request in requests:
        assert request.status is RequestStatus.FINISHED
        assert request.finish_reason is FinishReason.LENGTH and request.blocks == ()
    assert scheduler.kv.num_used == 0  # every held block came back; cached ones stay findable


def test_a_hit_reserves_only_what_is_not_cached_and_leaves_a_token_to_compute() -> None:
    scheduler = make_scheduler(4, kv_budget=KVBudget(8, BS), enable_prefix_caching=True)
    prompt = list(range(12))  # three full blocks
    first = GenRequest("a", 12, 4, num_output_tokens=0, block_hashes=block_hashes(prompt, BS))
    scheduler.add_request(first, 0.0)
    plan = scheduler.step(0.0)
    assert plan.admitted_cached_tokens == (0,) and len(first.blocks) == 4
    scheduler.postprocess(plan, 0.1)
    twin = GenRequest("b", 12, 4, num_output_tokens=0, block_hashes=block_hashes(prompt, BS))
    scheduler.add_request(twin, 0.1)
    before = scheduler.kv.num_used
    plan = scheduler.step(0.1)
    # two blocks shared (the third is the prompt's last: one token is always computed)
    assert plan.admitted_cached_tokens == (8,) and twin.blocks[:2] == first.blocks[:2]
    assert scheduler.kv.num_used == before + 2
    scheduler.postprocess(plan, 0.2)
    check_invariants(scheduler)


def test_a_paused_request_keeps_the_blocks_it_shares_pinned() -> None:
    scheduler = make_scheduler(1, {"target_output_tps": 5.0, "resident_headroom": 2,
                                   "paused_cap": 2}, target_x=0.1,
                               kv_budget=KVBudget(80, BS), enable_prefix_caching=True)  # fmt: skip
    prompt = list(range(9))
    old = GenRequest("old", 9, 200, arrival_time=0.0, first_token_time=0.0,
                     num_output_tokens=0, block_hashes=block_hashes(prompt, BS))  # fmt: skip
    scheduler.add_request(old, 0.0)
    now = 0.0
    for _ in range(5):
        plan = scheduler.step(now)
        scheduler.postprocess(plan, now + 0.01)
        now += 0.01
    new = GenRequest("new", 9, 3, arrival_time=now, first_token_time=now,
                     num_output_tokens=0, block_hashes=block_hashes(prompt, BS))  # fmt: skip
    scheduler.add_request(new, now)
    shared: tuple[int, ...] = ()
    num_paused_passes = 0
    while new.status is not RequestStatus.FINISHED:
        plan = scheduler.step(now)
        if "new" in plan.admitted_ids:
            shared = new.blocks[:2]
        if "old" in plan.paused_in_place_ids:
            num_paused_passes += 1
            pool = scheduler.kv.pool
            assert pool is not None and all(pool.num_holders(b) >= 1 for b in old.blocks)
        scheduler.postprocess(plan, now + 0.2)
        check_invariants(scheduler)
        now += 0.2
    assert num_paused_passes > 0  # old was paused for new, which shared its prefix
    assert new.num_cached_tokens == 8 and shared == old.blocks[:2]


def test_forgetting_a_failed_prefill_shares_none_of_it() -> None:
    scheduler = make_scheduler(4, kv_budget=KVBudget(12, BS), enable_prefix_caching=True)
    prompt = list(range(12))
    bad = GenRequest("bad", 12, 4, num_output_tokens=0, block_hashes=block_hashes(prompt, BS))
    scheduler.add_request(bad, 0.0)
    plan = scheduler.step(0.0)
    scheduler.forget_kv("bad")
    scheduler.abort("bad")
    scheduler.postprocess(plan, 0.1)
    again = GenRequest("again", 12, 4, num_output_tokens=0,
                       block_hashes=block_hashes(prompt, BS))  # fmt: skip
    scheduler.add_request(again, 0.1)
    plan = scheduler.step(0.1)
    assert plan.admitted_cached_tokens == (0,)


def test_a_waiter_that_did_not_fit_looks_its_prefix_up_again_after_a_forget() -> None:
    """A lookup is kept between ``can_fit`` and ``reserve``; a head that did not fit looks
    again once anything was forgotten since (its hits may hold other KV by then)."""
    account = KVAccount(KVBudget(6, BS), is_caching=True)
    prompt = list(range(12))
    first = GenRequest("first", 12, 4, num_output_tokens=0, block_hashes=block_hashes(prompt, BS))
    account.reserve(first)  # 4 blocks: 3 of prompt, 1 of output
    account.register_computed(first, 12)
    twin = GenRequest("twin", 12, 12, num_output_tokens=0, block_hashes=block_hashes(prompt, BS))
    assert not account.can_fit(twin)  # 2 hits + 4 new blocks, 2 free: waits
    account.forget(first)  # its prefill failed: nothing it wrote may be shared
    account.release(first)
    assert account.can_fit(twin)
    account.reserve(twin)
    assert twin.num_cached_tokens == 0, "a stale lookup shared a forgotten prefix"


def test_without_caching_nothing_is_looked_up_or_shared() -> None:
    scheduler = make_scheduler(4, kv_budget=KVBudget(12, BS))
    prompt = list(range(12))
    for name in ("a", "b"):
        scheduler.add_request(GenRequest(name, 12, 2, num_output_tokens=0,
                                         block_hashes=block_hashes(prompt, BS)), 0.0)  # fmt: skip
    plan = scheduler.step(0.0)
    assert plan.admitted_cached_tokens == (0, 0) and scheduler.kv.num_queried_tokens == 0


def _two_turns(scheduler: GenScheduler, first: dict[int, list[int]], stagger: bool) -> list[int]:
    """Each chat's first turn (all in one pass, or chat 0 a pass ahead), then its second
    (the first's prompt and reply, and a new message); the second turns' cached tokens.
    The reply's tokens are hashed as they come, as the worker does."""
    tokens: dict[str, list[int]] = {}
    requests: dict[str, GenRequest] = {}

    def submit(name: str, prompt: list[int], now: float) -> None:
        tokens[name] = list(prompt)
        requests[name] = GenRequest(name, len(prompt), 5, num_output_tokens=0,
                                    block_hashes=block_hashes(prompt, BS))  # fmt: skip
        scheduler.add_request(requests[name], now)

    for c in (0,) if stagger else first:
        submit(f"c{c}", first[c], 0.0)
    now, seconds = 0.0, []
    while scheduler.num_residents or scheduler.num_waiting or not seconds:
        plan = scheduler.step(now)
        scheduler.postprocess(plan, now + 0.05)
        for name in plan.batch_ids:
            tokens[name].append(7000 + len(tokens[name]))  # the token it made
            extend_hashes(requests[name].block_hashes, tokens[name], BS)
        now += 0.05
        if stagger and len(tokens) == 1:
            for c in (1, 2):
                submit(f"c{c}", first[c], now)
        finished = [n for n in tokens if n.startswith("c") and
                    requests[n].status is RequestStatus.FINISHED]  # fmt: skip
        for name in finished:
            reply = tokens.pop(name)
            submit("again-" + name, [*reply[:-1], 9000, 9001, 9002], now)
            seconds.append(name)
    return [requests[f"again-c{c}"].num_cached_tokens for c in first]


@pytest.mark.parametrize("stagger", [False, True], ids=["together", "one-ahead"])
def test_chats_prefilled_together_still_find_their_own_history_next_turn(stagger: bool) -> None:
    # A 10-token system prompt: the chats part inside a block, and inside a prefill
    # chunk (8 tokens a pass), which the first chat to get there registers.
    scheduler = make_scheduler(4, kv_budget=KVBudget(200, BS), enable_prefix_caching=True,
                               max_prefill_tokens_per_pass=8)  # fmt: skip
    system = list(range(1000, 1010))
    first = {c: [*system, *range(2000 + 100 * c, 2009 + 100 * c)] for c in range(3)}
    # Every block the first turn wrote: its 19 prompt tokens and 4 of its 5 replies.
    assert _two_turns(scheduler, first, stagger) == [(19 + 4) // BS * BS] * 3
    check_invariants(scheduler)
