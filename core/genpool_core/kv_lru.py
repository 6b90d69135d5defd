"""Free cached KV blocks in the order they were freed: the prefix cache's LRU
(docs/design.md#kv-blocks).

A queue of ``tick * stride + block`` entries with a tick per block: a block's entry is
live while its tick matches, so taking a block out of the middle (a prefix hit on a free
cached block) only resets its tick and leaves a dead entry behind, which the front skips
when it reaches it. Every operation is a plain loop over list and deque items (what
CPython runs fastest); a dict used as a queue would instead walk the holes its deleted
entries leave and rebuild itself as it grows, which cost the scheduling pass tens of
microseconds per release.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

NOT_QUEUED = -1


class FreedOrder:
    def __init__(self, num_blocks: int) -> None:
        self._stride = num_blocks + 1  # block ids 0 .. num_blocks (the dummy included)
        self._ticks = [NOT_QUEUED] * self._stride  # the tick of each block's live entry
        self._queue: collections.deque[int] = collections.deque()
        self._tick = 0
        self._num_queued = 0  # live entries

    def __len__(self) -> int:
        return self._num_queued

    def __contains__(self, block: int) -> bool:
        return self._ticks[block] != NOT_QUEUED

    def push(self, blocks: Iterable[int]) -> None:
        """Queue ``blocks`` (just freed, none queued) behind all queued so far, in order."""
        self._tick += 1
        tick, ticks, queue = self._tick, self._ticks, self._queue
        base = tick * self._stride
        before = len(queue)
        for block in blocks:
            ticks[block] = tick
            queue.append(base + block)
        self._num_queued += len(queue) - before
        if len(queue) > 2 * self._stride:  # dead entries outnumber what can be live
            self._compact()

    def remove(self, block: int) -> None:
        """Take a queued block out (it is held again); its entry dies in place."""
        self._ticks[block] = NOT_QUEUED
        self._num_queued -= 1

    def pop_oldest(self, count: int) -> list[int]:
        """The ``count`` least recently queued blocks, taken out (``count <= len``)."""
        if count > self._num_queued:
            raise RuntimeError(f"{count} freed blocks asked, {self._num_queued} queued")
        taken: list[int] = []
        ticks, queue, stride = self._ticks, self._queue, self._stride
        while len(taken) < count:
            tick, block = divmod(queue.popleft(), stride)
            if ticks[block] == tick:
                ticks[block] = NOT_QUEUED
                taken.append(block)
        self._num_queued -= count
        return taken

    def drain(self) -> list[int]:
        """Every queued block, oldest first, taken out."""
        return self.pop_oldest(self._num_queued)

    def _compact(self) -> None:
        ticks, stride = self._ticks, self._stride
        self._queue = collections.deque(
            entry for entry in self._queue if ticks[entry % stride] == entry // stride
        )
