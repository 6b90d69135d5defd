"""The result of one scheduling pass (docs/design.md#scheduling-pass): what runs, what stays paused.

The scheduler returns it; the engine, the simulator and every per-slot consumer read
it. Its digest is how tensor-parallel ranks prove they decided the same thing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GenPlan:
    """What one pass decided. Per-slot consumers must keep ``paused_in_place`` slots."""

    now: float
    batch_ids: tuple[str, ...]
    batch_slots: tuple[int, ...]
    paused_in_place_ids: tuple[str, ...]
    paused_in_place_slots: tuple[int, ...]
    admitted_ids: tuple[str, ...]
    resumed_ids: tuple[str, ...]
    paused_ids: tuple[str, ...]
    finished_ids: tuple[str, ...]
    stat_line: str | None = None

    def digest(self) -> str:
        """Rank-identity fingerprint: equal plans on every rank give equal digests."""
        return hashlib.sha256(repr(self).encode()).hexdigest()
