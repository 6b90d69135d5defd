"""Speculative decoding in the scheduling pass: each member's drafts in the plan (cut to
what it may emit; the digest covers them), several tokens a step counted as emitted, and
the SLO clock reading tokens, not steps."""

import pytest

from genpool_core.request import FinishReason, GenRequest
from genpool_core.scheduler import GenScheduler
from genpool_core.statline import format_statline, make_statline, parse_statline
from tests.unit.support import keyed, make_scheduler, unkeyed

K = 4


D4 = (11, 12, 13, 14)  # k drafted token ids


def _admitted(k: int = K, **settings: object) -> tuple[GenScheduler, float]:
    """``a`` (max_tokens 10) and ``b`` (max_tokens 3) past their prefill pass, each with
    ``k`` drafts proposed for its next step."""
    scheduler = make_scheduler(4, dict(settings), num_speculative_tokens=k)
    for request_id, max_tokens in (("a", 10), ("b", 3)):  # this worker prefills them
        scheduler.add_request(GenRequest(request_id, 8, max_tokens, num_output_tokens=0), 0.0)
    plan = scheduler.step(0.0)
    assert plan.prefill_ids == ("a", "b") and plan.drafts == (((), ()) if k else ())
    scheduler.postprocess(plan, 0.1, drafts={"a": D4[:k], "b": D4[:k]} if k else None)
    return scheduler, 0.1


def test_plan_states_each_members_drafts_cut_to_what_its_max_tokens_leaves() -> None:
    scheduler, now = _admitted()
    plan = scheduler.step(now)
    # a: 1 of 10 out, so min(4, 10 - 1 - 1) = 4 drafts; b: 1 of 3, so min(4, 3 - 1 - 1) = 1.
    assert plan.batch_ids == ("a", "b") and plan.drafts == (D4, D4[:1])
    assert plan.output_lengths == (1, 1)
    scheduler.postprocess(plan, now + 0.1, num_emitted={"a": 5, "b": 2}, drafts={"a": D4})
    assert scheduler.get_request("a").num_output_tokens == 6
    plan = scheduler.step(now + 0.2)
    assert plan.finished_ids == ("b",) and plan.finish_reasons == (FinishReason.LENGTH,)
    assert plan.drafts == (D4[:3],) and plan.output_lengths == (6,)  # a: 6 of 10 out
    scheduler.postprocess(plan, now + 0.3, num_emitted={"a": 4})
    plan = scheduler.step(now + 0.4)
    assert plan.finished_ids == ("a",) and scheduler.num_residents == 0


def test_the_digest_covers_the_drafts_and_what_was_accepted() -> None:
    """Two ranks that proposed different drafts, or accepted different counts, plan
    different digests a pass later."""
    digests = []
    for drafts, emitted in ((D4, 3), (D4, 3), ((11, 12, 13, 9), 3), (D4, 2)):
        scheduler, now = _admitted()
        plan = scheduler.step(now)
        scheduler.postprocess(plan, now + 0.1, num_emitted={"a": emitted}, drafts={"a": drafts})
        digests.append(scheduler.step(now + 0.2).digest())
    assert digests[0] == digests[1] and len(set(digests)) == 3


def test_a_member_without_new_drafts_verifies_none() -> None:
    scheduler, now = _admitted()
    plan = scheduler.step(now)
    scheduler.postprocess(plan, now + 0.1, drafts={"b": D4[:1]})  # a proposed none
    plan = scheduler.step(now + 0.2)
    assert plan.drafts == ((), ())  # b: 2 of 3 out, so none fits beside its own token


def test_a_paused_member_keeps_its_drafts_and_verifies_them_when_resumed() -> None:
    """r2 at risk pauses r1 (B = 1); every pass r1 is batched, the plan states the drafts
    last proposed for it, after its pause too (the specification's drafter state kept)."""
    settings = {"tpot_budget": 0.5, "paused_cap": 1, "resident_headroom": 1}
    scheduler = make_scheduler(1, settings, target_x=1.0, num_speculative_tokens=K)
    scheduler.add_request(keyed("r1", 0.0, max_tokens=1001), 0.0)
    last: tuple[int, ...] | None = None  # the drafts proposed for r1 after its last step
    paused = resumed = 0
    for n in range(40):
        now = n * 0.1
        if n == 10:
            scheduler.add_request(keyed("r2", now, max_tokens=3), now)
        plan = scheduler.step(now)
        paused += "r1" in plan.paused_ids
        resumed += "r1" in plan.resumed_ids
        if "r1" in plan.batch_ids and last is not None:
            assert plan.drafts[plan.batch_ids.index("r1")] == last, (n, plan)
        drafts = {rid: (n,) * K for rid in plan.batch_ids}
        scheduler.postprocess(plan, now + 0.1, drafts=drafts)
        last = drafts.get("r1", last)
    assert paused == 1 and resumed == 1


def test_an_imported_first_token_verifies_drafts_from_its_second_step() -> None:
    """A request admitted with its first token made elsewhere (P/D) has no prefill here:
    its first pass decodes without drafts (none proposed yet), then verifies them."""
    scheduler = make_scheduler(4, num_speculative_tokens=K)
    scheduler.add_request(unkeyed("a", max_tokens=4), 0.0)
    plan = scheduler.step(0.0)
    assert plan.imported_ids == ("a",) and plan.drafts == ((),)
    scheduler.postprocess(plan, 0.1, drafts={"a": D4})
    assert scheduler.step(0.2).drafts == (D4[:1],)  # 2 of 4 out: one draft and its own


def test_speculation_off_leaves_the_plan_as_it_was() -> None:
    scheduler, now = _admitted(k=0)
    plan = scheduler.step(now)
    assert plan.drafts == () and plan.output_lengths == ()
    with pytest.raises(ValueError, match="allows 1 to 1"):
        scheduler.postprocess(plan, now + 0.1, num_emitted={"a": 2})
    with pytest.raises(ValueError, match="speculative decoding off"):
        scheduler.postprocess(plan, now + 0.1, drafts={"a": (1,)})


@pytest.mark.parametrize(
    ("emitted", "drafts", "message"),
    [({"a": 6}, {}, "allows 1 to 5"), ({"b": 3}, {}, "allows 1 to 2"),
     ({"a": 0}, {}, "allows 1 to 5"), ({"zz": 1}, {}, "not in this pass's batch"),
     ({}, {"zz": (1,)}, "drafts for requests not in"), ({}, {"a": (1,) * 5}, "at most 4"),
     ({}, {"a": (-1,)}, "token ids >= 0")],
)  # fmt: skip
def test_a_count_or_draft_past_the_plan_is_refused_before_anything_counts(
    emitted: dict[str, int], drafts: dict[str, tuple[int, ...]], message: str
) -> None:
    scheduler, now = _admitted()
    plan = scheduler.step(now)
    with pytest.raises(ValueError, match=message):
        scheduler.postprocess(plan, now + 0.1, num_emitted=emitted, drafts=drafts)
    assert scheduler.get_request("a").num_output_tokens == 1
    assert scheduler.get_request("a").draft_token_ids == D4
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
            counts = {"a": emitted} if plan.drafts and plan.drafts[0] else None
            step = step_s if counts else 0.1  # the first step has no drafts yet: one token
            scheduler.postprocess(plan, now + step, num_emitted=counts, drafts={"a": D4})
            now += step
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
        emitted, drafted = ({"a": 3}, {"a": 4}) if plan.drafts[0] else (None, None)  # 1st: none
        scheduler.postprocess(plan, now + 0.25, (), emitted, drafted, drafts={"a": D4})
        now += 0.25
    stats = scheduler.make_stats(now)
    assert (stats.drafted, stats.accepted) == (44, 22)  # 11 steps of 4 drafts, 2 accepted
    # The line at t = 2: the window's four steps, and seven steps in all (the first none).
    assert line is not None and "drafted=16/28" in line and "accepted=8/14" in line
    parsed = parse_statline(line)
    assert parsed is not None and (parsed.drafted_total, parsed.accepted_window) == (28, 8)
    off = make_scheduler(4, {}, stat_interval_s=1.0)
    assert "drafted=" not in format_statline(make_statline(off.make_stats(0.0), None))
