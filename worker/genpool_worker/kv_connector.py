"""The KV connector (docs/pd.md#the-connector): every KV move other than computing a
request's KV here and freeing it at finish, behind one seam in two halves, as vLLM v1's
KVConnector splits it: a request side that acts on what the plan decided, and an
execution side that moves the bytes.

What a request's KV does is fixed before it queues (its ``KVTransfer``, carried by its
``Arrival``; the routes' half, ``kv_edge``, sets it), so every rank's scheduler reads the
same thing. The scheduler then states each move in its plan: ``GenPlan.imported_ids``
(KV loaded into the blocks an admission got), ``held_ids`` (blocks held at finish) and
``released_held_ids`` (held blocks given back). The request side (engine thread) hands
held blocks over and says when they may go back; the execution side (the model runner)
loads exactly the plan's imported ids, and reads held blocks for whoever takes them.
``NoKVConnector`` is a colocated worker's; P/D's is ``pd.connector``. No torch here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from genpool_worker.kv_layout import KVLayout

if TYPE_CHECKING:  # engine_io carries a KVTransfer on each Arrival
    from genpool_worker.engine_io import Arrival, EngineRequest


@dataclass(frozen=True)
class KVTransfer:
    """What one request's KV does besides being computed here; ``KVTransfer()``: nothing.

    ``first_token``: its prompt's KV is loaded from outside, where this first token was
    made ``first_token_age_s`` before the transfer was set up; it queues with one output
    token and never prefills here. ``holds_kv_at_finish``: it computes its prompt's KV for
    someone else, so it runs once (one choice, one token) and, unless aborted, its blocks
    stay held when it finishes. A connector subclasses it with what it needs (the bytes of
    a load, the id of an export); the engine reads only these fields.
    """

    first_token: int | None = None
    first_token_age_s: float = 0.0
    holds_kv_at_finish: bool = False

    @property
    def is_loaded(self) -> bool:
        return self.first_token is not None


class KVCachePort(Protocol):
    """What a KV cache offers a connector (the runner's, through its model)."""

    def kv_layout(self) -> KVLayout | None:
        """Its wire layout (None: its KV cannot move, e.g. one head shard of several)."""
        ...

    def read_kv(self, blocks: Sequence[int]) -> Iterator[bytes]:
        """The blocks' K and V bytes, per layer K then V (``KVLayout``'s order)."""
        ...

    def write_kv(self, blocks: Sequence[int], data: bytearray) -> None:
        """``read_kv``'s bytes, written into ``blocks``."""
        ...


class KVRequestSide(Protocol):
    """The engine thread's half: it acts on what each plan states."""

    def on_queued(self, arrival: Arrival) -> None:
        """``arrival`` joined the scheduler's queue: a load it carries is kept for the
        runner's ``load_kv`` (or ``drop``)."""
        ...

    def on_held(self, request: EngineRequest, blocks: tuple[int, ...]) -> bool:
        """The plan held ``request``'s ``blocks`` at its finish (``GenPlan.held_ids``).
        True: the connector keeps them until ``take_released`` names the request; False:
        nobody will take them, so the engine gives them back at once."""
        ...

    def drop(self, arrival: Arrival) -> None:
        """The request left (finished, refused or failed): a load it still holds is
        dropped and its bytes freed."""
        ...

    def take_released(self) -> list[str]:
        """Rank 0, once a pass, before its inputs: held requests whose blocks may go back
        now (taken, cancelled, or expired: the sweep of the untaken runs here)."""
        ...

    def set_wake(self, wake: Callable[[], None]) -> None:
        """``wake()`` (any thread) makes an idle engine pass at once: a connector calls it
        when held blocks may go back, so they do not wait for the next idle pass."""
        ...


class KVExecutionSide(Protocol):
    """The model runner's half, and the KV port the holders of exports read through."""

    def load_kv(self, request_id: str, blocks: tuple[int, ...]) -> int:
        """Write ``request_id``'s loaded KV into the first of ``blocks`` (its table, from
        the plan that admitted it, which names it in ``imported_ids``); its first token."""
        ...

    def kv_layout(self) -> KVLayout | None:
        """The cache's wire layout (None: this worker's KV cannot move)."""
        ...

    def read_kv(self, blocks: Sequence[int]) -> Iterator[bytes]:
        """Held blocks' bytes for whoever takes them (``KVLayout``'s order)."""
        ...


class KVConnector(KVRequestSide, KVExecutionSide, Protocol):
    """Both halves: what an engine is constructed with."""


class NoKVToLoad(RuntimeError):
    """A plan named a request whose KV this connector does not hold (it fails alone)."""


class NoKVConnector:
    """A colocated worker's connector: every request's KV is computed here and freed at
    finish; nothing is loaded, held for anyone or read out."""

    def on_queued(self, arrival: Arrival) -> None:
        pass

    def on_held(self, request: EngineRequest, blocks: tuple[int, ...]) -> bool:
        return False

    def drop(self, arrival: Arrival) -> None:
        pass

    def take_released(self) -> list[str]:
        return []

    def set_wake(self, wake: Callable[[], None]) -> None:
        pass

    def load_kv(self, request_id: str, blocks: tuple[int, ...]) -> int:
        raise NoKVToLoad(f"no KV to load for {request_id}: this worker has no KV connector")

    def kv_layout(self) -> KVLayout | None:
        return None

    def read_kv(self, blocks: Sequence[int]) -> Iterator[bytes]:
        raise NoKVToLoad("this worker's KV cannot be read out: it has no KV connector")


NO_KV_CONNECTOR = NoKVConnector()  # stateless: one serves every engine and runner
