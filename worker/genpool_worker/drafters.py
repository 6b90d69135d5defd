"""Speculative decoding's drafters (docs/worker.md#speculative-decoding): what proposes a
step's drafts for the runner to verify, one call per step over every drafting member.

- ``ngram``: prompt lookup over each request's own history (``speculative.NgramDrafter``,
  an index kept in its run state).
- ``early_exit``: self-speculation. The target's first ``num_draft_layers`` layers, then
  its output norm and head, decode the drafts greedily one position at a time. Its KV is
  the target's own for those layers, in the request's blocks: the verifying forward
  rewrites the drafted positions with every layer, and the rejected ones lie past the
  request's length. So the drafter needs no memory of its own, and a paused request's
  drafter state (its context length and the KV up to it) is pinned with its blocks;
  resumed, it drafts from its whole context. The drafts are point masses (argmax), so
  verification by the request's own sampler keeps the target distribution, and every
  tensor-parallel rank drafts the same tokens (the logits are whole on every rank).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar, runtime_checkable

import torch

from genpool_worker.model.runner_protocols import Tables
from genpool_worker.run_state import RunState
from genpool_worker.speculative import DrafterModelError, SpeculativeConfig

_CacheIn = TypeVar("_CacheIn", contravariant=True)


class Drafter(Protocol):
    def propose(
        self, states: Mapping[str, RunState], limits: Mapping[str, int]
    ) -> dict[str, list[int]]:
        """Each request's drafts, at most its limit (a request may get none)."""
        ...


@runtime_checkable
class LayeredModel(Protocol[_CacheIn]):
    """A network whose decode can stop after its first layers (``LlamaModel``)."""

    @property
    def num_layers(self) -> int: ...

    def decode(
        self,
        cache: _CacheIn,
        block_tables: Tables,
        token_ids: list[int],
        positions: list[int],
        *,
        num_layers: int | None = None,
    ) -> torch.Tensor: ...


class NgramDrafts:
    """Prompt lookup: each request's own n-gram index proposes."""

    def propose(
        self, states: Mapping[str, RunState], limits: Mapping[str, int]
    ) -> dict[str, list[int]]:
        drafts: dict[str, list[int]] = {}
        for request_id, limit in limits.items():
            drafter = states[request_id].drafter
            proposed = drafter.propose(limit) if drafter is not None else []
            if proposed:
                drafts[request_id] = proposed
        return drafts


class EarlyExitDrafts:
    """The target's first layers decode each drafting row, ``max(limits)`` forwards a step
    (a row leaves once it has its limit)."""

    def __init__(self, model: LayeredModel[object], cache: object, num_layers: int) -> None:
        self._model, self._cache, self.num_layers = model, cache, num_layers

    def propose(
        self, states: Mapping[str, RunState], limits: Mapping[str, int]
    ) -> dict[str, list[int]]:
        drafts: dict[str, list[int]] = {rid: [] for rid, limit in limits.items() if limit > 0}
        last: dict[str, int] = {}
        for request_id in drafts:
            token = states[request_id].last_token
            assert token is not None, f"{request_id} drafts before its first token"
            last[request_id] = token
        for step in range(max((limits[rid] for rid in drafts), default=0)):
            rows = [rid for rid in drafts if len(drafts[rid]) < limits[rid]]
            logits = self._model.decode(
                self._cache,
                [states[rid].blocks for rid in rows],
                [last[rid] for rid in rows],
                [states[rid].position + step for rid in rows],
                num_layers=self.num_layers,
            )
            for request_id, token in zip(rows, logits.argmax(dim=-1).tolist(), strict=True):
                drafts[request_id].append(token)
                last[request_id] = token
        return drafts


def make_drafter(spec: SpeculativeConfig, model: object, cache: object) -> Drafter:
    """The configured drafter over ``model`` and its ``cache``; refused when the
    model cannot run it (``DrafterModelError``: early exit needs a layered network, with
    more layers than draft)."""
    if spec.method == "ngram":
        return NgramDrafts()
    assert spec.num_draft_layers is not None  # the config requires it for early_exit
    if not isinstance(model, LayeredModel):
        raise DrafterModelError(
            "speculative method early_exit needs a layered network (a Llama checkpoint); "
            f"{type(model).__name__} has none"
        )
    if not 1 <= spec.num_draft_layers < model.num_layers:
        raise DrafterModelError(
            f"speculative num_draft_layers must be below the model's {model.num_layers} "
            f"layers, got {spec.num_draft_layers}"
        )
    return EarlyExitDrafts(model, cache, spec.num_draft_layers)


def draft_rows(states: Mapping[str, RunState], members: Sequence[str]) -> dict[str, int]:
    """The members that draft for their next step, each with how many it may
    (``RunState.max_drafts``)."""
    rows = {rid: states[rid].max_drafts for rid in members if states[rid].is_drafting}
    return {rid: limit for rid, limit in rows.items() if limit > 0}


def next_draft_length(length: int, num_drafted: int, num_accepted: int, k: int) -> int:
    """A request's next draft length after a step that verified ``num_drafted`` of its
    drafts (transformers' "heuristic" schedule for assisted generation): two more when
    every draft was accepted, one fewer otherwise, within 1..k. Each drafted row costs a
    row of the step's forward for every member (on a CPU about what a decoded token
    costs), so a request whose drafts keep failing soon drafts one token a step, and one
    whose drafts hold climbs back to k. Its own history only: every rank agrees."""
    if num_drafted == 0:
        return length
    if num_accepted == num_drafted:
        return min(k, length + 2)
    return max(1, length - 1)
