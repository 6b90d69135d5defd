"""One pass's speculative decoding for the model runner (docs/worker.md#speculative-decoding):
the drafts the plan states, one forward over them, verification (``spec_verify``), each
member's next draft length, and, once the pass's tokens are drawn, each member's drafts
for its next step (``drafters``), which the engine hands to the scheduler for the next
plan to state (genpool_core.speculation: so every rank verifies the same tokens).

A pass where anyone has drafts verifies every member that could draft in that one
forward, those without drafts as one-token rows, so it never pays a second forward for
the rest (members asking for logprobs excepted: the runner decodes them as before).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Generic, TypeVar

import torch

from genpool_core.plan import GenPlan
from genpool_worker.drafters import draft_rows, make_drafter, next_draft_length
from genpool_worker.model.kv_cache import PrefillSpan
from genpool_worker.model.runner_protocols import DecodeModel
from genpool_worker.request_faults import RequestFaults
from genpool_worker.run_state import RunState
from genpool_worker.spec_verify import Verified, verify
from genpool_worker.speculative import SpeculativeConfig

CacheT = TypeVar("CacheT")  # the KV cache's type (the runner's)


class Speculator(Generic[CacheT]):
    """The runner's drafter and verifier, over its network, cache and request states."""

    def __init__(
        self,
        config: SpeculativeConfig,
        model: DecodeModel[CacheT],
        cache: CacheT,
        states: Mapping[str, RunState],
    ) -> None:
        """A ``DrafterModelError`` when the network cannot run the configured drafter."""
        self.config = config
        self._drafter = make_drafter(config, model, cache)
        self._model, self._cache, self._states = model, cache, states

    def step(
        self, plan: GenPlan, decoding: list[str], faults: RequestFaults
    ) -> tuple[dict[str, Verified], dict[str, int]]:
        """What each member verified this pass emits, and how many drafts each verified
        (members with drafts only). A member absent from both decodes as usual."""
        drafts = {rid: list(d) for rid, d in zip(plan.batch_ids, plan.drafts, strict=True) if d}
        if not drafts.keys() & set(decoding):
            return {}, {}
        drafts = {r: drafts.get(r, []) for r in decoding
                  if r not in faults.failed and self._states[r].is_drafting}  # fmt: skip
        verified = self._verify(drafts, faults)
        drafted = {rid: len(drafts[rid]) for rid in verified if drafts[rid]}
        for request_id, num_drafted in drafted.items():
            state = self._states[request_id]
            state.num_draft_tokens = next_draft_length(
                state.num_draft_tokens, num_drafted, len(verified[request_id].accepted),
                self.config.num_speculative_tokens,
            )  # fmt: skip
        return verified, drafted

    def propose(self, plan: GenPlan, faults: RequestFaults) -> dict[str, list[int]]:
        """After the pass's tokens are drawn: each batch member's drafts for its next step,
        up to its draft length and what it may still emit (a row that breaks the drafter
        fails alone)."""
        limits = draft_rows(self._states, [r for r in plan.batch_ids if r not in faults.failed])
        if not limits:
            return {}
        _, proposals = faults.retry_alone(
            list(limits),
            lambda ids: self._drafter.propose(self._states, {r: limits[r] for r in ids}),
            lambda r: self._drafter.propose(self._states, {r: limits[r]}),
        )
        return {rid: d for proposal in proposals for rid, d in proposal.items() if d}

    def _verify(self, drafts: dict[str, list[int]], faults: RequestFaults) -> dict[str, Verified]:
        """The rows' last token and drafts through the network in one forward (positions
        written like a chunk's; the rejected ones' KV is past the request's length,
        masked, and overwritten by its next step), then verified (``spec_verify``)."""
        kept, forwards = faults.retry_alone(
            list(drafts),
            lambda ids: self._forward(ids, drafts),
            lambda r: self._forward([r], drafts),
        )
        logits: dict[str, torch.Tensor] = {}
        for forward in forwards:
            logits.update(forward)
        states = {rid: self._states[rid] for rid in kept}
        return verify(states, drafts, logits, faults)

    def _forward(
        self, request_ids: Sequence[str], drafts: dict[str, list[int]]
    ) -> dict[str, torch.Tensor]:
        spans = []
        for request_id in request_ids:
            state = self._states[request_id]
            assert state.last_token is not None and state.is_drafting
            tokens = [state.last_token, *drafts[request_id]]
            spans.append(PrefillSpan(state.blocks, tokens, state.position))
        logits = self._model.prefill_many(self._cache, spans, all_positions=True)
        rows = torch.split(logits, [len(span.token_ids) for span in spans])
        return dict(zip(request_ids, rows, strict=True))
