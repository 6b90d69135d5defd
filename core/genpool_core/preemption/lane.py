"""The resume lane: paused requests ordered by forced-resume due time."""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from genpool_core.request import GenRequest


class ResumeLane:
    """Earliest due first (in SLO mode: least laxity first); ties in pause order."""

    def __init__(self) -> None:
        self._entries: list[tuple[float, int, GenRequest]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[GenRequest]:
        return (entry[2] for entry in self._entries)

    def push(self, request: GenRequest, due: float) -> None:
        self._seq += 1
        bisect.insort(self._entries, (due, self._seq, request), key=lambda e: (e[0], e[1]))

    def remove(self, request: GenRequest) -> None:
        for position, entry in enumerate(self._entries):
            if entry[2] is request:
                del self._entries[position]
                return
        raise KeyError(request.request_id)

    def peek(self) -> GenRequest | None:
        return self._entries[0][2] if self._entries else None

    def is_head_due(self, now: float) -> bool:
        return bool(self._entries) and self._entries[0][0] <= now
