"""Verifying drafted tokens (docs/worker.md#speculative-decoding): the target model's
logits at every drafted position come from one forward (the runner's); this module
decides, position by position, what each request emits.

At position ``j`` the request's own sampler draws a token exactly as a plain decode step
would (penalties, ``min_tokens`` masks, temperature, top-k/p, its seeded generator) and
the draft at ``j`` is accepted when the draw equals it. The n-gram drafter's proposal is a
point mass, for which this is rejection sampling: a draft ``d`` is kept with probability
``p(d)``, and a rejection emits a token drawn from ``p`` without ``d``, renormalised, so
every emitted token has the target's distribution. The generator draws once per emitted
token, as without speculation, so even a seeded sampled request emits the same text.
A draw that is not the draft, a stop token, or the position after the last draft ends
the run: that draw is the request's own token for the step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from genpool_worker.model.sampler import SampleRow, sample
from genpool_worker.request_faults import RequestFaults


class Verifiable(Protocol):
    """A request's run state, as verification reads and moves it."""

    sample: SampleRow
    stop_ids: tuple[int, ...]

    def mask_stops(self) -> None: ...

    def took(self, token: int) -> None: ...


@dataclass(frozen=True)
class Verified:
    """What one request emits this step: its accepted drafts, then its own token."""

    accepted: list[int]
    token: int


def verify(
    states: Mapping[str, Verifiable],
    drafts: Mapping[str, Sequence[int]],
    logits: Mapping[str, torch.Tensor],
    faults: RequestFaults,
) -> dict[str, Verified]:
    """``logits[rid]`` ``[len(drafts[rid]) + 1, vocab]``: the target's logits after the
    request's last token and after each of its drafts. Rounds go position by position
    over the requests still accepting, each round one sampler call (a row that breaks it
    fails alone)."""
    accepted: dict[str, list[int]] = {rid: [] for rid in logits}
    done: dict[str, Verified] = {}
    for position in range(max((len(rows) for rows in logits.values()), default=0)):
        going = [r for r in logits if r not in done and r not in faults.failed]
        if not going:
            break
        for request_id in going:
            states[request_id].mask_stops()
        rows = torch.stack([logits[rid][position] for rid in going])
        kept, tokens = _draw(going, rows, states, faults)
        for request_id, token in zip(kept, tokens, strict=True):
            _take(request_id, token, position, states[request_id], drafts, accepted, done)
    return done


def _draw(
    going: list[str], rows: torch.Tensor, states: Mapping[str, Verifiable], faults: RequestFaults
) -> tuple[list[str], list[int]]:
    """One sampler call over ``rows`` (one per request going); one row at a time if it
    raises, so a row that breaks it fails alone."""
    index = {rid: i for i, rid in enumerate(going)}

    def alone(request_id: str) -> list[int]:
        i = index[request_id]
        return sample(rows[i : i + 1], [states[request_id].sample])[0]

    kept, drawn = faults.retry_alone(
        going, lambda ids: sample(rows, [states[r].sample for r in ids])[0], alone
    )
    return kept, [token for batch in drawn for token in batch]


def _take(
    request_id: str,
    token: int,
    position: int,
    state: Verifiable,
    drafts: Mapping[str, Sequence[int]],
    accepted: dict[str, list[int]],
    done: dict[str, Verified],
) -> None:
    state.took(token)
    draft = drafts[request_id]
    if position < len(draft) and token == draft[position] and token not in state.stop_ids:
        accepted[request_id].append(token)
    else:
        done[request_id] = Verified(accepted[request_id], token)
