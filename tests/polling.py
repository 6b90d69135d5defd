"""Polling with a deadline, for tests of every tier: against processes, HTTP servers and
the API server. It imports nothing heavy (the unit tier blocks kubernetes), so a 404 from
the API is recognised by its shape, not its class."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _is_api_not_found(exc: Exception) -> bool:
    """The kubernetes client's ``ApiException`` (or its ``NotFoundException`` subclass)
    with status 404: "not there yet"."""
    is_api = any(cls.__name__ == "ApiException" for cls in type(exc).__mro__)
    return is_api and getattr(exc, "status", None) == 404


def wait_for(
    check: Callable[[], T | None], what: str, timeout: float = 60.0, *, interval: float = 0.25
) -> T:
    """Poll ``check`` until it returns something truthy and return that.

    A 404 from the API counts as "not there yet"; any other error propagates. Fails
    with ``what`` and the last value seen after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            result = check()
        except Exception as exc:
            if not _is_api_not_found(exc):
                raise
            last = exc
        else:
            if result:
                return result
            last = result
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
