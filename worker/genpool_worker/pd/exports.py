"""The KV a prefill worker holds for decode workers to pull (docs/pd.md#the-pull).

One export per finished prefill leg: its request's block table, held by the scheduler
(``GenScheduler.release_held``) until the one pull has sent it, the pull broke, the decode
worker cancelled it or it expired. Whichever comes first releases the blocks, once. The
engine thread adds and sweeps; HTTP handlers claim and finish. Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

OUTCOMES = ("ok", "failed", "expired", "cancelled")


@dataclass(frozen=True, slots=True)
class Export:
    """A finished prefill leg's KV, as its pull needs it."""

    transfer_id: str
    request_id: str
    blocks: tuple[int, ...]  # the prompt's blocks, in table order
    num_prompt_tokens: int
    first_token: int
    expires_at: float  # monotonic s


class ExportRegistry:
    """``release(request_id)`` lets the scheduler's held blocks go (the connector hands
    them to the engine's next pass: ``PDConnector.take_released``);
    ``on_outcome(outcome)`` counts how each export ended (metrics)."""

    def __init__(
        self,
        release: Callable[[str], None],
        *,
        timeout_s: float,
        on_outcome: Callable[[str], None] = lambda outcome: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"the KV export timeout must be > 0 s, got {timeout_s}")
        self.timeout_s = timeout_s
        self._release, self._on_outcome, self._clock = release, on_outcome, clock
        self._lock = threading.Lock()
        self._waiting: dict[str, Export] = {}  # not pulled yet
        self._pulling: dict[str, Export] = {}  # a pull is sending it

    def add(self, transfer_id: str, request_id: str, blocks: tuple[int, ...],
            num_prompt_tokens: int, first_token: int) -> Export:  # fmt: skip
        export = Export(transfer_id, request_id, blocks, num_prompt_tokens, first_token,
                        self._clock() + self.timeout_s)  # fmt: skip
        with self._lock:
            self._waiting[transfer_id] = export
        return export

    def get(self, transfer_id: str) -> Export | None:
        with self._lock:
            return self._waiting.get(transfer_id) or self._pulling.get(transfer_id)

    def claim(self, transfer_id: str) -> Export | None:
        """Start the one pull of ``transfer_id``; None when unknown, expired or pulled."""
        with self._lock:
            export = self._waiting.pop(transfer_id, None)
            if export is not None:
                self._pulling[transfer_id] = export
            return export

    def finish(self, transfer_id: str, *, is_ok: bool) -> None:
        """The pull ended (sent whole, or broke): its blocks go back either way."""
        with self._lock:
            export = self._pulling.pop(transfer_id, None)
        if export is not None:
            self._end(export, "ok" if is_ok else "failed")

    def cancel(self, transfer_id: str) -> bool:
        """``DELETE``: the decode worker will not pull (it answered from the first token,
        or fell back). A pull under way is left to finish. False when not waiting."""
        with self._lock:
            export = self._waiting.pop(transfer_id, None)
        if export is None:
            return False
        self._end(export, "cancelled")
        return True

    def sweep(self) -> int:
        """Release every export not pulled by its deadline; how many expired."""
        now = self._clock()
        with self._lock:
            expired = [e for e in self._waiting.values() if e.expires_at <= now]
            for export in expired:
                del self._waiting[export.transfer_id]
        for export in expired:
            self._end(export, "expired")
        return len(expired)

    def release_all(self) -> None:
        """Shutdown: nothing will be pulled any more."""
        with self._lock:
            ended = [*self._waiting.values(), *self._pulling.values()]
            self._waiting.clear()
            self._pulling.clear()
        for export in ended:
            self._end(export, "cancelled")

    @property
    def num_held(self) -> int:
        with self._lock:
            return len(self._waiting) + len(self._pulling)

    def _end(self, export: Export, outcome: str) -> None:
        self._release(export.request_id)
        self._on_outcome(outcome)
