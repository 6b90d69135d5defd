"""A bad request fails alone (docs/worker.md#engine-loop): what one request causes inside
the engine (its KV import, prefill, decode row, sampling row, detokenizing) is caught,
recorded against that request and the pass goes on with the others. No torch here.

A batched call that raises cannot say whose row broke it, so it is run again one row at
a time: a decode writes the same K/V rows again, and a row's draw may come from a later
number of its generator (the price of a pass that failed, paid only then). When every row of
a batch of two or more fails alone too, the fault is the engine's, not a request's, and
it is raised: the loop dies, every request gets a 503 and the process exits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

log = logging.getLogger("genpool.worker")
T = TypeVar("T")
MAX_MESSAGE_CHARS = 300


class EngineFault(RuntimeError):
    """Every row of a batch failed on its own too: the engine is broken, not a request."""


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:MAX_MESSAGE_CHARS]


class RequestFaults:
    """The requests that failed this pass, with why (request id -> message)."""

    def __init__(self) -> None:
        self.failed: dict[str, str] = {}

    @contextmanager
    def of(self, request_id: str) -> Iterator[None]:
        """Run one request's part; an exception fails that request only."""
        try:
            yield
        except Exception as exc:
            self.fail(request_id, exc)

    def fail(self, request_id: str, exc: BaseException) -> None:
        log.warning("request %s failed in the engine: %s", request_id, describe(exc))
        self.failed.setdefault(request_id, describe(exc))

    def retry_alone(
        self,
        request_ids: Sequence[str],
        batched: Callable[[Sequence[str]], T],
        alone: Callable[[str], T],
    ) -> tuple[list[str], list[T]]:
        """``batched(request_ids)`` as one result; if it raises, ``alone`` per request:
        the ids that succeeded and their results (one batched result, or one each)."""
        try:
            return list(request_ids), [batched(request_ids)]
        except Exception as exc:
            first = exc
        kept: list[str] = []
        results: list[T] = []
        for request_id in request_ids:
            try:
                results.append(alone(request_id))
            except Exception as exc:
                self.fail(request_id, exc)
                continue
            kept.append(request_id)
        if not kept and len(request_ids) > 1:
            raise EngineFault(f"every row of a batch of {len(request_ids)} failed: "
                              f"{describe(first)}") from first  # fmt: skip
        return kept, results
