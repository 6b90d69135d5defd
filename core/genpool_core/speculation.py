"""Speculative decoding's share of the scheduling pass (docs/design.md#speculative-decoding).

A batch member may emit several tokens in one step: the worker drafts up to ``k`` tokens
after its last one, the model verifies them in the step's forward, and the member emits
the accepted drafts plus one token of its own. The plan states, per batch member, how
many drafts it may verify (``GenPlan.draft_limits``), so every rank verifies the same
number and no member can overshoot ``max_tokens``; ``postprocess`` is told how many
tokens each member emitted. Rates, laxity and T floors all read ``num_output_tokens``,
so they count emitted tokens, not steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from genpool_core.request import GenRequest


def draft_limits(
    batch: Iterable[GenRequest], prefill_ids: Iterable[str], num_speculative_tokens: int
) -> tuple[int, ...]:
    """Each batch member's draft limit, in batch order: ``min(k, remaining - 1)`` (its
    own token always fits), 0 for a member whose token this pass comes from its prefill.
    Empty when speculation is off, so a plan without it is unchanged."""
    if num_speculative_tokens <= 0:
        return ()
    prefilling = set(prefill_ids)
    return tuple(
        0
        if r.request_id in prefilling or r.num_output_tokens == 0
        else max(0, min(num_speculative_tokens, r.max_tokens - r.num_output_tokens - 1))
        for r in batch
    )


def check_emitted(
    batch_ids: tuple[str, ...], limits: tuple[int, ...], emitted: Mapping[str, int]
) -> None:
    """``emitted`` (request id -> tokens this step) names batch members only, each with
    1 to ``1 + its draft limit`` tokens; raises ``ValueError`` before anything counts."""
    if not emitted:  # every pass without speculation: nothing to check
        return
    unknown = set(emitted).difference(batch_ids)
    if unknown:
        raise ValueError(f"emitted counts for requests not in this pass's batch: {sorted(unknown)}")
    limit_of = dict(zip(batch_ids, limits, strict=True)) if limits else {}
    for request_id, count in emitted.items():
        limit = limit_of.get(request_id, 0)
        if not 1 <= count <= 1 + limit:
            raise ValueError(
                f"{request_id!r} emitted {count} tokens; its plan allows 1 to {1 + limit}"
            )
