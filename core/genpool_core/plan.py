"""The result of one scheduling pass (docs/design.md#scheduling-pass): what runs, what
stays paused, who needs a prefill, who finished and why, and every KV move: the blocks
each admission gets, what of them it shares, whose KV is loaded from outside, whose
blocks stay held at finish and which held blocks went back.

The scheduler returns it; the engine, the simulator and every per-slot consumer read
it and never re-derive a decision from their own state. Its digest is how
tensor-parallel ranks prove they decided the same thing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from genpool_core.request import FinishReason
from genpool_core.statline import StatLine, format_statline


@dataclass(frozen=True, slots=True)
class GenPlan:
    """What one pass decided. Per-slot consumers must keep ``paused_in_place`` slots.

    ``prefill_ids`` are the batch members with no output token yet (this worker does
    their prefill, or its last chunk; its token is their token for the pass).
    ``prefill_chunks`` (chunked prefill only, else empty): ``(request id, start, end)``
    prompt positions each prefilling request runs this pass, oldest first; a request
    whose chunk ends short of its prompt is in no other field and gets no token.
    ``admitted_blocks`` is each admitted request's KV block table (aligned with
    ``admitted_ids``; empty without a KV budget): the runner writes their KV there until
    they finish. ``admitted_cached_tokens`` (aligned with ``admitted_ids``): the prompt
    tokens each admission found in the prefix cache, held in the first blocks of its
    table; its prefill computes the positions after them. ``imported_ids``: the
    admissions whose prompt KV is loaded from outside into their tables (admitted with
    their first token already made elsewhere: no prefill here), in admission order.
    ``finish_reasons`` is aligned with ``finished_ids``; ``held_ids``: those finished
    requests whose blocks stay held (their KV is exported) instead of going back.
    ``released_held_ids``: held requests whose blocks went back since the previous pass
    (before this pass admitted anyone). ``drafts`` and ``output_lengths``
    (speculative decoding only, else empty; aligned with ``batch_ids``): the drafted
    tokens each member verifies this step, and its output tokens so far (what earlier
    steps accepted; genpool_core.speculation). ``stat`` is the pass's stat line, when one is due.
    """

    now: float
    batch_ids: tuple[str, ...]
    batch_slots: tuple[int, ...]
    prefill_ids: tuple[str, ...]
    paused_in_place_ids: tuple[str, ...]
    paused_in_place_slots: tuple[int, ...]
    admitted_ids: tuple[str, ...]
    admitted_blocks: tuple[tuple[int, ...], ...]
    resumed_ids: tuple[str, ...]
    paused_ids: tuple[str, ...]
    finished_ids: tuple[str, ...]
    finish_reasons: tuple[FinishReason, ...]
    stat: StatLine | None = None
    prefill_chunks: tuple[tuple[str, int, int], ...] = ()
    admitted_cached_tokens: tuple[int, ...] = ()
    imported_ids: tuple[str, ...] = ()
    held_ids: tuple[str, ...] = ()
    released_held_ids: tuple[str, ...] = ()
    drafts: tuple[tuple[int, ...], ...] = ()
    output_lengths: tuple[int, ...] = ()

    @property
    def stat_line(self) -> str | None:
        """The stat line as logged (``stat`` formatted)."""
        return None if self.stat is None else format_statline(self.stat)

    def digest(self) -> str:
        """Rank-identity fingerprint: equal plans on every rank give equal digests."""
        return hashlib.sha256(repr(self).encode()).hexdigest()
