"""Speculative decoding in the scheduling pass: each member's draft limit in the plan,
several tokens a step counted as emitted, and the SLO clock reading tokens, not steps."""

import pytest

from genpool_core.request import FinishReason, GenRequest
from genpool_core.scheduler import GenScheduler
from genpool_core.statline import format_statline, make_statline, parse_statline
from tests.unit.support import keyed, make_scheduler, unkeyed

K = 4


def _admitted(k: int = K, **settings: object) -> tuple[GenScheduler, float]:
    """``a`` (max_tokens 10) and ``b`` (max_tokens 3) past their prefill pass."""
    scheduler = make_scheduler(4, dict(settings), num_speculative_tokens=k)
    for request_id, max_tokens in (("a", 10), ("b", 3)):  # this worker prefills them
        scheduler.add_request(GenRequest(request_id, 8, max_tokens, num_output_tokens=0), 0.0)
    plan = scheduler.step(0.0)
    assert plan.prefill_ids == ("a", "b") and plan.draft_limits == ((0, 0) if k else ())
    scheduler.postprocess(plan, 0.1)
    return scheduler, 0.1


def test_plan_limits_each_member_to_k_and_to_what_its_max_tokens_leaves() -> None:
    scheduler, now = _admitted()
    plan = scheduler.step(now)
    # a: 1 of 10 out, so min(4, 10 - 1 - 1) = 4; b: 1 of 3, so min(4, 3 - 1 - 1) = 1.
    assert plan.batch_ids == ("a", "b") and plan.draft_limits == (4, 1)
    scheduler.postprocess(plan, now + 0.1, num_emitted={"a": 5, "b": 2})
    assert scheduler.get_request("a").num_output_tokens == 6
    plan = scheduler.step(now + 0.2)
    assert plan.finished_ids == ("b",) and plan.finish_reasons == (FinishReason.LENGTH,)
    assert plan.draft_limits == (3,)  # a: 6 of 10 out
    scheduler.postprocess(plan, now + 0.3, num_emitted={"a": 4})
    plan = scheduler.step(now + 0.4)
    assert plan.finished_ids == ("a",) and scheduler.num_residents == 0


def test_an_imported_first_token_drafts_from_the_first_step() -> None:
    """A request admitted with its first token made elsewhere (P/D) has no prefill here:
    its first pass decodes, and may verify drafts."""
    scheduler = make_scheduler(4, num_speculative_tokens=K)
    scheduler.add_request(unkeyed("a", max_tokens=3), 0.0)
    plan = scheduler.step(0.0)
    assert plan.imported_ids == ("a",) and plan.draft_limits == (1,)


def test_speculation_off_leaves_the_plan_as_it_was() -> None:
    scheduler, now = _admitted(k=0)
    plan = scheduler.step(now)
    assert plan.draft_limits == ()
    with pytest.raises(ValueError, match="allows 1 to 1"):
        scheduler.postprocess(plan, now + 0.1, num_emitted={"a": 2})


@pytest.mark.parametrize(
    ("emitted", "message"),
    [({"a": 6}, "allows 1 to 5"), ({"b": 3}, "allows 1 to 2"), ({"a": 0}, "allows 1 to 5"),
     ({"zz": 1}, "not in this pass's batch")],
)  # fmt: skip
def test_a_count_past_the_plan_is_refused_before_anything_counts(
    emitted: dict[str, int], message: str
) -> None:
    scheduler, now = _admitted()
    plan = scheduler.step(now)
    with pytest.raises(ValueError, match=message):
        scheduler.postprocess(plan, now + 0.1, num_emitted=emitted)
    assert scheduler.get_request("a").num_output_tokens == 1
    scheduler.postprocess(plan, now + 0.1, num_emitted={"a": 5})  # the plan is still open
    assert scheduler.get_request("a").num_output_tokens == 6


def test_negative_k_is_refused() -> None:
    with pytest.raises(ValueError, match="num_speculative_tokens must be >= 0"):
        make_scheduler(4, num_speculative_tokens=-1)


def test_the_slo_rate_prior_is_per_emitted_token() -> None:
    """Steps of 0.4 s that emit 4 tokens per member are 0.1 s per token to the policy's
    prior, as 0.1 s steps of one token are."""
    priors = []
    for emitted, step_s in ((4, 0.4), (1, 0.1)):
        scheduler = make_scheduler(2, {"target_output_tps": 5.0}, num_speculative_tokens=K)
        scheduler.add_request(keyed("a", 0.0, max_tokens=1000), 0.0)
        now = 0.0
        for _ in range(6):
            plan = scheduler.step(now)
            counts = {"a": emitted} if plan.draft_limits and plan.draft_limits[0] else None
            scheduler.postprocess(plan, now + step_s, num_emitted=counts)
            now += step_s
        priors.append(scheduler.policy.prior_rate())  # type: ignore[attr-defined]
    assert priors[0] == pytest.approx(priors[1]) and priors[0] == pytest.approx(10.0)


def test_the_stat_line_counts_drafted_and_emitted_drafts() -> None:
    scheduler = make_scheduler(4, {}, num_speculative_tokens=K, stat_interval_s=1.0)
    scheduler.add_request(unkeyed("a", max_tokens=100), 0.0)
    now = 0.0
    for _ in range(12):
        plan = scheduler.step(now)
        if plan.stat is not None:
            line = plan.stat_line
        scheduler.postprocess(plan, now + 0.25, num_emitted={"a": 3}, num_drafted={"a": 4})
        now += 0.25
    stats = scheduler.make_stats(now)
    assert (stats.drafted, stats.accepted) == (48, 24)
    assert line is not None and "drafted=16/32" in line and "accepted=8/16" in line
    parsed = parse_statline(line)
    assert parsed is not None and (parsed.drafted_total, parsed.accepted_window) == (32, 8)
    off = make_scheduler(4, {}, stat_interval_s=1.0)
    assert "drafted=" not in format_statline(make_statline(off.make_stats(0.0), None))
