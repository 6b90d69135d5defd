"""Polling with a deadline, for tests against processes and the API server."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes.client.rest import ApiException

T = TypeVar("T")


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
        except ApiException as exc:
            if exc.status != 404:
                raise
            last = exc
        else:
            if result:
                return result
            last = result
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
