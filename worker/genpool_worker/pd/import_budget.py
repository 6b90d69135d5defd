"""What a decode worker lets pulled KV take (docs/pd.md#the-pull): at most
``max_pulls`` pulls in flight, and at most ``max_bytes`` of pulled KV in host memory
(pulls in flight plus pulled requests still waiting to be admitted, whose bytes leave
once written into their blocks). Past the pull cap a pull waits its turn, up to
``PULL_QUEUE_TIMEOUT_S`` (a burst of ordinary requests must not be refused: its pulls
take a second or two each); past the bytes cap, or after that wait, the request gets a
503 before anything is pulled, so host memory stays bounded whatever the clients send.
Thread-safe: the HTTP side reserves, the engine thread releases
(``request_kv.KVImport.release``); the turns are the event loop's."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

from genpool_worker.pd.flags import DEFAULT_MAX_KV_IMPORT_BYTES, DEFAULT_MAX_KV_PULLS

PULL_QUEUE_TIMEOUT_S = 10.0  # a pull waits this long for its turn past --max-kv-pulls


class ImportCapReached(Exception):
    """A pull would pass a cap: the message says which (the request's 503)."""


@dataclass
class ImportBudget:
    max_pulls: int = DEFAULT_MAX_KV_PULLS
    max_bytes: int = DEFAULT_MAX_KV_IMPORT_BYTES

    def __post_init__(self) -> None:
        if self.max_pulls < 1 or self.max_bytes < 1:
            raise ValueError("the KV import caps must be >= 1")
        self._lock = threading.Lock()
        self._turns = asyncio.Semaphore(self.max_pulls)  # pulls past the cap queue here
        self.num_pulls = 0
        self.num_bytes = 0

    async def start_pull_in_turn(self, num_bytes: int,
                                 timeout_s: float = PULL_QUEUE_TIMEOUT_S) -> None:  # fmt: skip
        """``start_pull`` after waiting for a free pull (up to ``timeout_s``, else
        ``ImportCapReached``); end it with ``end_pull_in_turn``."""
        try:
            await asyncio.wait_for(self._turns.acquire(), timeout_s)
        except TimeoutError:
            raise ImportCapReached(
                f"{self.num_pulls} KV pulls in flight for {timeout_s:g} s"
                f" (--max-kv-pulls={self.max_pulls})"
            ) from None
        try:
            self.start_pull(num_bytes)
        except ImportCapReached:
            self._turns.release()
            raise

    def end_pull_in_turn(self, num_bytes_kept: int, num_bytes_reserved: int) -> None:
        self.end_pull(num_bytes_kept, num_bytes_reserved)
        self._turns.release()

    def start_pull(self, num_bytes: int) -> None:
        """Reserve a pull and its bytes, or raise ``ImportCapReached`` (nothing reserved)."""
        with self._lock:
            if self.num_pulls >= self.max_pulls:
                raise ImportCapReached(
                    f"{self.num_pulls} KV pulls in flight (--max-kv-pulls={self.max_pulls})"
                )
            if self.num_bytes + num_bytes > self.max_bytes:
                raise ImportCapReached(
                    f"{self.num_bytes} bytes of pulled KV held, {num_bytes} more asked"
                    f" (--max-kv-import-bytes={self.max_bytes})"
                )
            self.num_pulls += 1
            self.num_bytes += num_bytes

    def end_pull(self, num_bytes_kept: int, num_bytes_reserved: int) -> None:
        """The pull is over: ``num_bytes_kept`` stay held (until ``release``)."""
        with self._lock:
            self.num_pulls -= 1
            self.num_bytes -= num_bytes_reserved - num_bytes_kept

    def release(self, num_bytes: int) -> None:
        """Pulled bytes left host memory (written, or their request went)."""
        with self._lock:
            self.num_bytes -= num_bytes
