"""The resident slot pool: which KV-cache slot each resident request holds.

Every per-resident buffer in the engine is sized from :meth:`SlotPool.pool_size`
(``B + max_resident_headroom``) plus one dummy slot at index ``pool_size``. With no
live change of headroom ``max_resident_headroom == resident_headroom`` and this is
the ``B + H`` of docs/design.md#capacity with the dummy at ``num_slots``. Headroom can be
lowered or raised at run time within the ceiling; lowering it never evicts anyone, it only
stops allocations until residents finish.
"""

from __future__ import annotations

import heapq


class SlotPool:
    def __init__(
        self, max_batch_size: int, resident_headroom: int, max_resident_headroom: int
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if not 0 <= resident_headroom <= max_resident_headroom:
            raise ValueError(
                f"resident_headroom={resident_headroom} must be within "
                f"[0, max_resident_headroom={max_resident_headroom}]"
            )
        self.max_batch_size = max_batch_size
        self._headroom = resident_headroom
        self._max_headroom = max_resident_headroom
        self._free: list[int] = list(range(self.pool_size))
        heapq.heapify(self._free)

    def resident_headroom(self) -> int:
        return self._headroom

    def max_resident_headroom(self) -> int:
        return self._max_headroom

    @property
    def pool_size(self) -> int:
        """Slots allocated for the whole life of the worker (the dummy excluded)."""
        return self.max_batch_size + self._max_headroom

    @property
    def dummy_slot(self) -> int:
        """Scratch slot for batch padding; never given to a request."""
        return self.pool_size

    @property
    def num_slots(self) -> int:
        """Resident capacity in force: ``B + H``."""
        return self.max_batch_size + self._headroom

    @property
    def num_used(self) -> int:
        return self.pool_size - len(self._free)

    @property
    def num_free(self) -> int:
        return max(0, self.num_slots - self.num_used)

    def can_allocate(self) -> bool:
        return self.num_used < self.num_slots

    def allocate(self) -> int:
        """Hand out the lowest free slot index (deterministic across ranks)."""
        if not self.can_allocate():
            raise RuntimeError("no free resident slot")
        return heapq.heappop(self._free)

    def free(self, slot: int) -> None:
        if not 0 <= slot < self.pool_size or slot in self._free:
            raise ValueError(f"slot {slot} is not allocated")
        heapq.heappush(self._free, slot)

    def set_resident_headroom(self, headroom: int) -> None:
        """Change H live; a value below ``num_used - B`` takes effect as residents finish."""
        if not 0 <= headroom <= self._max_headroom:
            raise ValueError(
                f"resident_headroom={headroom} must be within "
                f"[0, max_resident_headroom={self._max_headroom}]"
            )
        self._headroom = headroom
