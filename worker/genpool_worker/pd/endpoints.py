"""Prefill endpoints (``host:port``) a decode worker sends prefill legs to and pulls KV
from: the pool's known ones (``--prefillers``, ``PUT /prefillers`` from the operator),
taken round robin. The ``x-prefiller-host-port`` header (llm-d's picker) is parsed the
same way; it is followed only to a known endpoint, unless the worker trusts the router
(``--trust-prefiller-header``): docs/operations.md#threat-model."""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Iterable

PREFILLER_HEADER = "x-prefiller-host-port"  # llm-d's name (docs/pd.md)
MAX_ENDPOINTS = 1024
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]{1,253})$")


def endpoint_text(host: str, port: int) -> str:
    """``host:port`` as ``parse_endpoint`` spells it (an IPv6 host bracketed)."""
    bracketed = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{bracketed}:{port}"


def parse_endpoint(text: str) -> str:
    """``host:port`` (IPv6 bracketed) as given, or ``ValueError`` saying what is wrong."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not _HOST.match(host):
        raise ValueError(f"{text[:80]!r} is not host:port")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{text[:80]!r}: the port must be 1-65535")
    return f"{host}:{int(port)}"


def parse_endpoints(items: Iterable[str]) -> tuple[str, ...]:
    found = tuple(parse_endpoint(item) for item in items if item.strip())
    if len(found) > MAX_ENDPOINTS:
        raise ValueError(f"at most {MAX_ENDPOINTS} prefill endpoints, got {len(found)}")
    return found


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
