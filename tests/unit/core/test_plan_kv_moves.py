"""The plan states every KV move (docs/design.md#scheduling-pass): besides each
admission's blocks and cached tokens, whose KV is loaded from outside
(``imported_ids``), whose blocks stay held at finish (``held_ids``) and which held
blocks went back (``released_held_ids``), each from the scheduler's own state, and the
digest covers them (tensor-parallel ranks prove they agree on them too)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genpool_core.kv_blocks import KVBudget
from genpool_core.plan import GenPlan
from genpool_core.request import GenRequest
from tests.unit.support import check_invariants, make_scheduler, run_pass


def _request(request_id: str, *, num_output_tokens: int = 0, holds: bool = False,
             prompt_len: int = 20, max_tokens: int = 4) -> GenRequest:  # fmt: skip
    return GenRequest(request_id, prompt_len, max_tokens, arrival_time=0.0,
                      num_output_tokens=num_output_tokens, holds_kv_at_finish=holds)  # fmt: skip


@pytest.mark.parametrize("prefill_budget", [None, 8])
def test_an_admission_with_its_first_token_made_elsewhere_is_imported(
    prefill_budget: int | None,
) -> None:
    scheduler = make_scheduler(kv_budget=KVBudget(16, 16),
                               max_prefill_tokens_per_pass=prefill_budget)  # fmt: skip
    scheduler.add_request(_request("local"), 0.0)
    scheduler.add_request(_request("loaded", num_output_tokens=1), 0.0)
    plan = run_pass(scheduler, 0.0)
    assert plan.admitted_ids == ("local", "loaded")
    assert plan.imported_ids == ("loaded",)  # it decodes at once: no prefill here
    assert "loaded" in plan.batch_ids and "loaded" not in plan.prefill_ids
    assert run_pass(scheduler, 0.2).imported_ids == ()  # only in its admission's plan


def test_a_held_finish_and_its_release_are_each_in_one_plan() -> None:
    scheduler = make_scheduler(kv_budget=KVBudget(16, 16))
    scheduler.add_request(_request("leg", holds=True, max_tokens=1), 0.0)
    scheduler.add_request(_request("plain", max_tokens=1), 0.0)
    run_pass(scheduler, 0.0)  # both prefilled: their one token ends them
    finish = run_pass(scheduler, 0.2)
    assert set(finish.finished_ids) == {"leg", "plain"}
    assert finish.held_ids == ("leg",) and finish.released_held_ids == ()
    assert scheduler.release_held("leg") and not scheduler.release_held("leg")
    released = run_pass(scheduler, 0.4)
    assert released.released_held_ids == ("leg",)  # once, however often it was asked
    assert run_pass(scheduler, 0.6).released_held_ids == ()


def test_an_aborted_leg_is_not_held() -> None:
    scheduler = make_scheduler(kv_budget=KVBudget(16, 16))
    scheduler.add_request(_request("leg", holds=True, max_tokens=5), 0.0)
    run_pass(scheduler, 0.0)
    scheduler.abort("leg")
    plan = run_pass(scheduler, 0.2)
    assert plan.finished_ids == ("leg",) and plan.held_ids == ()


@pytest.mark.parametrize(
    ("field", "value"),
    [("imported_ids", ("a",)), ("held_ids", ("a",)), ("released_held_ids", ("a",))],
)
def test_the_digest_covers_every_kv_move(field: str, value: tuple[str, ...]) -> None:
    plan = GenPlan(0.0, ("a",), (0,), (), (), (), ("a",), ((1, 2),), (), (), (), ())
    assert dataclasses.replace(plan, **{field: value}).digest() != plan.digest()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.sampled_from(["plain", "loaded", "held"]),
                          st.booleans()), min_size=1, max_size=16))  # fmt: skip
def test_the_plans_account_for_every_held_block(requests: list[tuple[int, str, bool]]) -> None:
    """Whatever mix of loaded, held and plain requests: every plan's imported ids are its
    admissions that came with a token, its held ids the finished ones whose blocks the
    scheduler holds, and every held request's release is stated once."""
    scheduler = make_scheduler(max_batch_size=4, kv_budget=KVBudget(64, 16))
    kinds = {f"r{i}": kind for i, (_, kind, _) in enumerate(requests)}
    releases_early = {f"r{i}" for i, (_, _, early) in enumerate(requests) if early}
    for i, (prompt_len, kind, _) in enumerate(requests):
        request = _request(f"r{i}", num_output_tokens=int(kind == "loaded"),
                           holds=kind == "held", prompt_len=prompt_len,
                           max_tokens=1 if kind == "held" else 3)  # fmt: skip
        scheduler.add_request(request, 0.0)
    held: set[str] = set()
    released: list[str] = []
    now = 0.0
    for _ in range(4 * len(requests) + 8):
        plan = run_pass(scheduler, now)
        now += 0.2
        check_invariants(scheduler)
        assert plan.imported_ids == tuple(i for i in plan.admitted_ids if kinds[i] == "loaded")
        assert set(plan.held_ids) <= set(plan.finished_ids)
        held |= set(plan.held_ids)
        released += plan.released_held_ids
        assert set(scheduler.kv.held_ids()) == held - set(released)
        for request_id in set(scheduler.kv.held_ids()) & releases_early:
            scheduler.release_held(request_id)
    for request_id in scheduler.kv.held_ids():
        scheduler.release_held(request_id)
    released += scheduler.step(now).released_held_ids
    assert sorted(released) == sorted(held)  # each once
    assert held == {i for i, kind in kinds.items() if kind == "held"}
