"""Free cached KV blocks in the order they were freed: the prefix cache's LRU
(docs/design.md#kv-blocks).

A queue of the tables freed together (the blocks one release let go of, last first),
each push a new tick. The pool's holder counts (a list by block id, shared with the
pool) say which entries are live: a queued block's count is ``-tick`` of its table, so
taking a block out of the middle (a prefix hit on a free cached block: its count
becomes 1) leaves a dead entry behind, which the front skips when it reaches it; a
table nothing was taken out of (the common case, noted by tick) is popped by slices,
with no count read. A push and a pop are plain loops over the table (what CPython runs
fastest, and no object per block); a dict used as a queue would instead walk the holes
its deleted entries leave and rebuild itself as it grows, which cost the scheduling
pass tens of microseconds per release.
"""

from __future__ import annotations

import collections


class FreedOrder:
    def __init__(self, counts: list[int]) -> None:
        self._counts = counts  # the pool's: < 0 for a queued block (-tick of its table)
        self._tables: collections.deque[tuple[int, list[int]]] = collections.deque()
        self._cursor = 0  # entries of the front table already passed
        self._tick = 0
        self.num_queued = 0  # live entries (an attribute: read every admission)
        self._num_entries = 0  # entries not passed yet, live or dead
        self._dead: set[int] = set()  # the ticks of tables with an entry taken out

    def push(self, blocks: list[int]) -> None:
        """Queue ``blocks`` (just freed, none queued; the list is kept) behind all queued
        so far, in order."""
        self._tick += 1
        tick = -self._tick
        counts = self._counts
        for block in blocks:
            counts[block] = tick
        self._tables.append((tick, blocks))
        self.num_queued += len(blocks)
        self._num_entries += len(blocks)
        if self._num_entries > 2 * len(counts):  # dead entries outnumber what can be live
            self._compact()

    def remove(self, block: int) -> None:
        """Take a queued block out: it is held again (its count set to 1), and its entry
        dies in place."""
        counts = self._counts
        tick = counts[block]
        self._dead.add(tick)
        counts[block] = 1
        self.num_queued -= 1

    def pop_oldest(self, count: int) -> list[int]:
        """The ``count`` least recently queued blocks, taken out (``count <= len``)."""
        if count > self.num_queued:
            raise RuntimeError(f"{count} freed blocks asked, {self.num_queued} queued")
        taken: list[int] = []
        counts, tables, cursor, dead = self._counts, self._tables, self._cursor, self._dead
        passed = 0
        while len(taken) < count:
            tick, blocks = tables[0]
            # At most what is still missing: a dead entry leaves room for the next turn.
            chunk = blocks[cursor : cursor + count - len(taken)]
            # A table nothing was taken out of is live throughout: no count to read.
            live = [block for block in chunk if counts[block] == tick] if tick in dead else chunk
            for block in live:
                counts[block] = 0
            taken += live
            cursor += len(chunk)
            passed += len(chunk)
            if cursor == len(blocks):
                dead.discard(tick)
                tables.popleft()
                cursor = 0
        self._cursor = cursor
        self.num_queued -= count
        self._num_entries -= passed
        return taken

    def drain(self) -> list[int]:
        """Every queued block, oldest first, taken out."""
        return self.pop_oldest(self.num_queued)

    def _compact(self) -> None:
        counts, cursor = self._counts, self._cursor
        tables: collections.deque[tuple[int, list[int]]] = collections.deque()
        for tick, blocks in self._tables:
            live = [block for block in blocks[cursor:] if counts[block] == tick]
            cursor = 0
            if live:
                tables.append((tick, live))
        self._tables, self._cursor = tables, 0
        self._dead.clear()
        self._num_entries = self.num_queued
