"""Speculative decoding's share of the scheduling pass (docs/design.md#speculative-decoding).

A batch member may emit several tokens in one step: the worker drafts up to ``k`` tokens
after its last one, the model verifies them in the step's forward, and the member emits
the accepted drafts plus one token of its own. The drafts are proposed at the end of the
step that made that last token and handed to ``postprocess`` (``store_drafts``); the next
plan that batches the member states them, cut to what it may still emit
(``GenPlan.drafts``), with its output so far (``GenPlan.output_lengths``). So the plan
says what every member verifies: every rank verifies the same tokens, no member can
overshoot ``max_tokens``, and the plan's digest covers the drafts and, through the
output lengths, what earlier steps accepted. A paused member keeps its drafts and
verifies them when it resumes. ``postprocess`` is told how many tokens each member
emitted. Rates, laxity and T floors all read ``num_output_tokens``, so they count
emitted tokens, not steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from genpool_core.request import GenRequest

Drafts = tuple[tuple[int, ...], ...]  # a plan's drafts, aligned with its batch


def scheduled_drafts(
    batch: Iterable[GenRequest], prefill_ids: Iterable[str], num_speculative_tokens: int
) -> tuple[Drafts, tuple[int, ...]]:
    """Each batch member's drafts to verify this step, in batch order: those proposed
    for it, at most ``remaining - 1`` (its own token always fits); and each member's
    output so far. Both empty when speculation is off, so a plan without it is unchanged.
    A member whose token this pass comes from its prefill verifies none."""
    if num_speculative_tokens <= 0:
        return (), ()
    members, prefilling = list(batch), set(prefill_ids)
    drafts = tuple(
        ()
        if r.request_id in prefilling
        else r.draft_token_ids[: max(0, r.max_tokens - r.num_output_tokens - 1)]
        for r in members
    )
    return drafts, tuple(r.num_output_tokens for r in members)


def store_drafts(
    batch: Mapping[str, GenRequest],
    drafts: Mapping[str, Sequence[int]],
    num_speculative_tokens: int,
) -> None:
    """Each batch member's drafts for its next step (``drafts`` names batch members only,
    each with at most ``k`` token ids >= 0; a member it omits has none); checked whole
    before any is kept (``ValueError``)."""
    unknown = set(drafts).difference(batch)
    if unknown:
        raise ValueError(f"drafts for requests not in this pass's batch: {sorted(unknown)}")
    for request_id, tokens in drafts.items():
        if len(tokens) > num_speculative_tokens or not all(
            isinstance(t, int) and t >= 0 for t in tokens
        ):
            raise ValueError(
                f"{request_id!r} drafts {list(tokens)[:8]}: at most "
                f"{num_speculative_tokens} token ids >= 0"
            )
    for request_id, request in batch.items():
        request.draft_token_ids = tuple(drafts.get(request_id, ()))


def check_emitted(batch_ids: tuple[str, ...], drafts: Drafts, emitted: Mapping[str, int]) -> None:
    """``emitted`` (request id -> tokens this step) names batch members only, each with
    1 to ``1 + its drafts`` tokens; raises ``ValueError`` before anything counts."""
    if not emitted:  # every pass without speculation: nothing to check
        return
    unknown = set(emitted).difference(batch_ids)
    if unknown:
        raise ValueError(f"emitted counts for requests not in this pass's batch: {sorted(unknown)}")
    limit_of = dict(zip(batch_ids, map(len, drafts), strict=True)) if drafts else {}
    for request_id, count in emitted.items():
        limit = limit_of.get(request_id, 0)
        if not 1 <= count <= 1 + limit:
            raise ValueError(
                f"{request_id!r} emitted {count} tokens; its plan allows 1 to {1 + limit}"
            )
