"""Chunked prefill: a per-pass prefill token budget (docs/design.md#scheduling-pass).

Without a budget an admitted request is prefilled whole in the pass that admits it, and
that pass's decode step waits for it: one 2k-token prompt stalls every running
request's next token for its whole prefill. With ``max_prefill_tokens_per_pass`` the
admitted requests that still need a prefill wait here; each pass hands out chunks until
the budget is spent, so a pass costs one decode step plus at most ``budget`` prefill
tokens.

Who gets the budget is decided by the admission queue's notion of risk (docs/design.md#
chunked-prefill): a request's *laxity* is its slack (its admission target less the time
it has waited) less the passes its remaining prompt needs at the recent prefill pass
time. Requests that can still make their target go first, least laxity first; then
those that cannot (or have no target yet), fewest remaining tokens first; ties in
admission order. A short interactive prompt admitted behind long ones is then not held
for all their chunks. The starvation bound: the oldest prompt gets at least a quarter
of every pass's budget (``OLDEST_SHARE``), so a long prompt finishes within four times
the passes it would take alone at the head. ``order="arrival"`` serves oldest first
instead (first come, first served, as before risk ordering). A request joins the batch (and gets its
first token) in the pass its last chunk runs; until then it is a resident holding a
batch position and its KV blocks, but not a batch member: it gets no token, is counted
in no step, and no policy sees it (it can never be a pause victim).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, get_args

from genpool_core.request import GenRequest

# (request id, first prompt position, one past the last) of one pass's prefill work.
PrefillChunk = tuple[str, int, int]
PrefillOrder = Literal["risk", "arrival"]  # who gets each pass's budget first
PREFILL_ORDERS: tuple[str, ...] = get_args(PrefillOrder)
OLDEST_SHARE = 4  # the oldest prompt's floor: 1 / OLDEST_SHARE of each pass's budget
PASS_TIME_WEIGHT = 0.2  # weight of the latest prefill pass in the pass-time average
SlackOf = Callable[[GenRequest], "float | None"]  # the admission queue's slack, at now


class PrefillQueue:
    """Admitted requests with prefill left, in admission order, and how far each has got."""

    def __init__(self, budget: int, order: PrefillOrder = "risk") -> None:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError(f"max_prefill_tokens_per_pass must be an int >= 1, got {budget!r}")
        if order not in PREFILL_ORDERS:
            raise ValueError(f"prefill order must be one of {PREFILL_ORDERS}, got {order!r}")
        self.budget = budget
        self.is_by_risk = order == "risk"
        self._waiting: dict[str, GenRequest] = {}  # insertion order = admission order
        self._done: dict[str, int] = {}  # prompt tokens already prefilled
        self.pass_s = 0.0  # recent duration of a pass with prefill work (moving average)

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._waiting

    def ids(self) -> tuple[str, ...]:
        return tuple(self._waiting)

    def add(self, request: GenRequest) -> None:
        """Prefill starts after the prompt tokens the prefix cache already holds."""
        self._waiting[request.request_id] = request
        self._done[request.request_id] = request.num_cached_tokens

    def remove(self, request_id: str) -> None:
        """A request that left mid-prefill (aborted)."""
        del self._waiting[request_id]
        del self._done[request_id]

    def num_prefilled(self, request_id: str) -> int:
        return self._done[request_id]

    def observe_pass(self, seconds: float) -> None:
        """A pass that ran prefill chunks took ``seconds``."""
        seconds = max(0.0, seconds)
        is_first = self.pass_s == 0.0
        self.pass_s = (
            seconds if is_first else self.pass_s + PASS_TIME_WEIGHT * (seconds - self.pass_s)
        )

    def hand_out(
        self, *, is_decoding: bool, slack_of: SlackOf = lambda _: None
    ) -> tuple[list[PrefillChunk], list[GenRequest]]:
        """This pass's chunks (within the budget, by risk) and the requests whose prefill
        they complete (removed from here: the caller puts them in the batch).

        With nobody decoding (``is_decoding`` False) the first prompt by risk is prefilled
        whole: there is no decode step to stall, and the engine runs the model only for a
        pass with batch members, so every pass that has chunks must have one.
        """
        if not self._waiting:
            return [], []
        grants = self._grants(is_decoding, slack_of)
        chunks: list[PrefillChunk] = []
        completed: list[GenRequest] = []
        for request_id, num_tokens in grants.items():
            request = self._waiting[request_id]
            start = self._done[request_id]
            end = start + num_tokens
            chunks.append((request_id, start, end))
            if end == request.prompt_len:
                completed.append(request)
                self.remove(request_id)
            else:
                self._done[request_id] = end
        return chunks, completed

    def _grants(self, is_decoding: bool, slack_of: SlackOf) -> dict[str, int]:
        """Tokens per request this pass, in the order their chunks run (by risk)."""
        oldest = next(iter(self._waiting))
        ranked = list(self._waiting)  # admission order
        if self.is_by_risk:
            ranked.sort(key=lambda i: self._rank(i, slack_of))
        reserved = min(self._remaining(oldest), max(1, self.budget // OLDEST_SHARE))
        left = self.budget
        if not is_decoding:  # the first by risk whole (see hand_out), the oldest its floor
            top = ranked[0]
            left = max(left, self._remaining(top) + (0 if top == oldest else reserved))
        grants: dict[str, int] = {}
        for request_id in ranked:
            if request_id == oldest:
                grant, reserved = min(self._remaining(oldest), left), 0
            else:
                grant = min(self._remaining(request_id), left - reserved)
            if grant > 0:
                grants[request_id] = grant
                left -= grant
        return grants

    def _remaining(self, request_id: str) -> int:
        return self._waiting[request_id].prompt_len - self._done[request_id]

    def _rank(self, request_id: str, slack_of: SlackOf) -> tuple[int, float]:
        """(0, laxity) for a request that can still make its target, else (1, remaining
        tokens); ``sorted`` is stable, so ties stay in admission order."""
        remaining = self._remaining(request_id)
        slack = slack_of(self._waiting[request_id])
        if slack is not None:
            laxity = slack - math.ceil(remaining / self.budget) * self.pass_s
            if laxity >= 0:
                return 0, laxity
        return 1, remaining
