"""Polling with a deadline, for tests of every tier: against processes, HTTP servers and
the API server. It imports nothing heavy (the unit tier blocks kubernetes), so a 404 from
the API is recognised by its shape, not its class.

``wait_for`` blocks its thread (``wait_until`` is it for a value and a predicate on it);
``wait_for_async`` is the same poll for a coroutine, so the event loop's other tasks
(requests in flight) keep running while it waits."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


def _is_api_not_found(exc: Exception) -> bool:
    """The kubernetes client's ``ApiException`` (or its ``NotFoundException`` subclass)
    with status 404: "not there yet"."""
    is_api = any(cls.__name__ == "ApiException" for cls in type(exc).__mro__)
    return is_api and getattr(exc, "status", None) == 404


class PollTimeout(AssertionError):
    """A poll ran out of time (an ``AssertionError``: a test failure, not an error)."""


def _timed_out(what: str, timeout: float, last: Any) -> PollTimeout:
    return PollTimeout(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


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
    raise _timed_out(what, timeout, last)


def wait_until(
    get: Callable[[], T],
    ok: Callable[[T], bool],
    what: str,
    timeout: float = 60.0,
    *,
    interval: float = 0.25,
) -> T:
    """Poll ``get`` until ``ok`` holds for its value and return that value. Like
    ``wait_for``, but a timeout shows the last value itself, not a bare ``False``."""
    last: Any = None

    def check() -> tuple[T] | None:
        nonlocal last
        last = get()
        return (last,) if ok(last) else None

    try:
        return wait_for(check, what, timeout, interval=interval)[0]
    except PollTimeout:
        raise _timed_out(what, timeout, last) from None


@overload
async def wait_for_async(
    check: Callable[[], Awaitable[T | None]],
    what: str,
    timeout: float = ...,
    *,
    interval: float = ...,
) -> T: ...


@overload
async def wait_for_async(
    check: Callable[[], T | None], what: str, timeout: float = ..., *, interval: float = ...
) -> T: ...


async def wait_for_async(
    check: Callable[[], Any],
    what: str,
    timeout: float = 60.0,
    *,
    interval: float = 0.05,
) -> Any:
    """``wait_for`` inside an event loop: ``check`` may be a plain function or return an
    awaitable (an HTTP call on an async client); between tries the loop runs its other
    tasks. Same rules: a 404 from the API is "not yet", other errors propagate."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            if not _is_api_not_found(exc):
                raise
            last = exc
        else:
            if result:
                return result
            last = result
        await asyncio.sleep(interval)
    raise _timed_out(what, timeout, last)
