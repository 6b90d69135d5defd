"""Speculative decoding in the simulator (docs/sim.md, Model): how many
tokens each batch member emits in a step, and what verifying its drafts costs.

The worker proposes each member's drafts at the end of its step, and the next plan that
batches it states them, cut to what it may still emit (``GenPlan.drafts``); they are
verified in that step's one forward. Here every member proposes ``k`` drafts (token ids
the simulator never reads: only how many the plan keeps counts), so it verifies
``l = min(k, remaining - 1)`` of them, and each draft is accepted with probability
``acceptance_rate`` given the ones before it were (the usual i.i.d. model: ``j``
accepted with probability ``a^j (1 - a)`` for ``j < l``, ``a^l`` for ``j = l``), so a
member emits ``1 + j`` tokens. The draw is a
pure function of the request and its output so far, not of event order. Verifying costs
what a decode step of every member's ``1 + l`` rows at its context costs: the step
model's per-row and per-context terms grow with the drafted rows.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from genpool_core.plan import GenPlan
from genpool_core.request import GenRequest


def verified(
    plan: GenPlan, residents: Mapping[str, GenRequest], acceptance_rate: float
) -> tuple[dict[str, int], dict[str, int]]:
    """Tokens each drafting member emits this step, and the drafts it verified (members
    without drafts are in neither: they emit 1)."""
    emitted: dict[str, int] = {}
    drafted: dict[str, int] = {}
    for request_id, drafts in zip(plan.batch_ids, plan.drafts, strict=True):
        if limit := len(drafts):
            at = residents[request_id].num_output_tokens
            emitted[request_id] = 1 + accepted(f"{request_id}:{at}", limit, acceptance_rate)
            drafted[request_id] = limit
    return emitted, drafted


def proposed(plan: GenPlan, num_speculative_tokens: int) -> dict[str, tuple[int, ...]]:
    """Each batch member's drafts for its next step: ``k`` placeholder tokens (none when
    speculation is off)."""
    if num_speculative_tokens <= 0:
        return {}
    drafts = (0,) * num_speculative_tokens
    return dict.fromkeys(plan.batch_ids, drafts)


def accepted(key: str, limit: int, acceptance_rate: float) -> int:
    """Drafts accepted out of ``limit``, drawn from a generator seeded by ``key``."""
    draw = random.Random(key)
    count = 0
    while count < limit and draw.random() < acceptance_rate:
        count += 1
    return count


def expected_tokens_per_step(limit: int, acceptance_rate: float) -> float:
    """Mean tokens a member emits per step: ``1 + a + a^2 + ... + a^limit``."""
    return sum(acceptance_rate**j for j in range(limit + 1))
