"""``host:port`` endpoints as flags, headers and admin bodies spell them: parsed and
checked once here (a bad one is a ``ValueError`` saying what is wrong), spelled back the
same way. Pure: no sockets, no lookups."""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_ENDPOINTS = 1024  # in one list: a flag or an admin body
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
    """Every non-blank item parsed, at most ``MAX_ENDPOINTS`` of them."""
    found = tuple(parse_endpoint(item) for item in items if item.strip())
    if len(found) > MAX_ENDPOINTS:
        raise ValueError(f"at most {MAX_ENDPOINTS} prefill endpoints, got {len(found)}")
    return found
