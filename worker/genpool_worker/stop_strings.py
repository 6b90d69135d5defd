"""OpenAI ``stop`` strings over streamed text: the output ends just before the stop
string that is completed first, which may span any number of token deltas. "Completed
first" (earliest end; on a tie the longer string) is what generating text one piece at
a time sees, so the result does not depend on how the text is split into tokens.

Text that could still be the start of a stop string is held back until the next delta
settles it, so a client never sees a prefix of a stop string that then matches.
"""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]) -> None:
        if not stops or not all(stops):
            raise ValueError("stop strings must be non-empty")
        self.stops = stops
        self.is_stopped = False
        self._held = ""
        self._max_held = max(len(stop) for stop in stops) - 1

    def feed(self, text: str) -> str:
        """The part of ``held + text`` that is safe to send now. On a match: the text
        before the first completed stop string, and ``is_stopped`` is set (later text is
        dropped)."""
        if self.is_stopped:
            return ""
        buffer = self._held + text
        matches = [(at + len(stop), at) for stop in self.stops if (at := buffer.find(stop)) >= 0]
        if matches:
            self.is_stopped = True
            self._held = ""
            return buffer[: min(matches)[1]]
        num_held = self._num_held(buffer)
        self._held = buffer[len(buffer) - num_held :]
        return buffer[: len(buffer) - num_held]

    def flush(self) -> str:
        """What was held back, once the request ended without a match."""
        held, self._held = self._held, ""
        return "" if self.is_stopped else held

    def _num_held(self, buffer: str) -> int:
        """Length of the longest suffix of ``buffer`` that starts some stop string."""
        for size in range(min(len(buffer), self._max_held), 0, -1):
            tail = buffer[-size:]
            if any(stop.startswith(tail) for stop in self.stops):
                return size
        return 0
