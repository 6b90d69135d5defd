"""Prefill endpoints (``host:port``) a decode worker sends prefill legs to and pulls KV
from: the pool's known ones (``--prefillers``, ``PUT /prefillers`` from the operator),
taken round robin. The ``x-prefiller-host-port`` header (llm-d's picker) is parsed the
same way; it is followed only to a known endpoint, unless the worker trusts the router
(``--trust-prefiller-header``): docs/operations.md#threat-model."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable

from genpool_worker.host_port import parse_endpoint, parse_endpoints

PREFILLER_HEADER = "x-prefiller-host-port"  # llm-d's name (docs/pd.md)


def header_endpoint(value: str) -> str:
    """The header's first endpoint (llm-d may list several, comma-separated)."""
    return parse_endpoint(value.split(",")[0])


class Prefillers:
    """The known prefill endpoints; ``next`` cycles through them (None: none known)."""

    def __init__(self, endpoints: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._endpoints: tuple[str, ...] = ()
        self._cycle: itertools.cycle[str] | None = None
        self.replace(endpoints)

    def replace(self, endpoints: Iterable[str]) -> tuple[str, ...]:
        found = parse_endpoints(endpoints)
        with self._lock:
            self._endpoints = found
            self._cycle = itertools.cycle(found) if found else None
        return found

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._endpoints

    def is_known(self, endpoint: str) -> bool:
        """``endpoint`` (``host:port``) is one of the pool's prefill workers."""
        return endpoint in self._endpoints

    def next(self) -> str | None:
        with self._lock:
            return None if self._cycle is None else next(self._cycle)
