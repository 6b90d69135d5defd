"""Cached runs with free blocks, least recently freed first: the prefix cache's LRU
(docs/design.md#kv-blocks).

A run joins the back of the queue whenever a release frees more of it (its tail beyond
its longest hold, genpool_core.kv_index), so the order is that of the last release that
freed any of it; a request lets go of its runs last first, so its last blocks are the
first evicted and its prefix, the most shared, the last. A hit that holds a queued run
again leaves its entry behind (the entry's tick no longer matches the run's) and the
front skips it; entries are counted per run, never per block, and the queue is rebuilt
without dead entries whenever they outnumber the live ones.
"""

from __future__ import annotations

import collections

from genpool_core.kv_index import CachedRun

MIN_COMPACT_ENTRIES = 64  # dead entries the queue may carry before a rebuild pays


class FreedRuns:
    def __init__(self) -> None:
        self._queue: collections.deque[tuple[int, CachedRun]] = collections.deque()
        self._tick = 0
        self._num_live = 0  # runs queued now (one live entry each)
        self.num_queued = 0  # their free blocks (an attribute: read every admission)

    def freed(self, run: CachedRun, num_free_before: int) -> None:
        """``run`` was let go of: what it frees now joins the back of the queue."""
        grown = run.num_free - num_free_before
        if grown <= 0:
            return
        self.num_queued += grown
        if not run.queued_at:
            self._num_live += 1
        self._tick += 1
        run.queued_at = self._tick
        self._queue.append((self._tick, run))
        if len(self._queue) > 2 * self._num_live + MIN_COMPACT_ENTRIES:
            self._compact()

    def held(self, run: CachedRun, num_free_before: int) -> None:
        """``run`` was held once more: it frees less (none: it leaves the queue)."""
        self.num_queued += run.num_free - num_free_before
        if run.queued_at and not run.num_free:
            run.queued_at = 0  # its entry is dead
            self._num_live -= 1

    def evict(self, count: int) -> list[tuple[CachedRun, int]]:
        """Which runs give up ``count`` free blocks (``count <= num_queued``), oldest
        first, and how many each (from its end; the caller takes them)."""
        if count > self.num_queued:
            raise RuntimeError(f"{count} freed blocks asked, {self.num_queued} queued")
        queue = self._queue
        taken: list[tuple[CachedRun, int]] = []
        left = count
        while left:
            tick, run = queue[0]
            if run.queued_at != tick:  # dead: the run was held again, or queued anew
                queue.popleft()
                continue
            num_taken = min(left, run.num_free)
            taken.append((run, num_taken))
            left -= num_taken
            if num_taken == run.num_free:
                queue.popleft()
                run.queued_at = 0
                self._num_live -= 1
        self.num_queued -= count
        return taken

    def drain(self) -> list[tuple[CachedRun, int]]:
        """Every queued run and its free blocks, taken out."""
        taken = self.evict(self.num_queued)
        self._queue.clear()
        return taken

    @property
    def num_entries(self) -> int:
        """Entries in the queue, dead ones included (tests)."""
        return len(self._queue)

    def _compact(self) -> None:
        self._queue = collections.deque(
            (tick, run) for tick, run in self._queue if run.queued_at == tick
        )
