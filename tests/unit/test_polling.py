"""The tests' polling helper works in every tier (no kubernetes needed) and fails clearly."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.polling import wait_for, wait_for_async, wait_until


class ApiException(Exception):  # the kubernetes client's shape: a status attribute
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class NotFoundException(ApiException):
    """What the kubernetes client raises for a 404 (a subclass of its ApiException)."""


def test_it_returns_the_first_truthy_value() -> None:
    values = iter([None, 0, "", "ready"])
    assert wait_for(lambda: next(values), what="a value", interval=0) == "ready"


def test_an_api_404_means_not_there_yet_and_other_errors_propagate() -> None:
    calls = itertools.count()

    def appears_on_the_third_call() -> str:
        n = next(calls)
        if n < 2:
            raise NotFoundException(404) if n else ApiException(404)
        return "there"

    assert wait_for(appears_on_the_third_call, what="an object", interval=0) == "there"
    with pytest.raises(ApiException):
        wait_for(lambda: (_ for _ in ()).throw(ApiException(500)), what="x", interval=0)
    with pytest.raises(ValueError):
        wait_for(lambda: int("nope"), what="x", interval=0)


def test_a_timeout_names_what_it_waited_for_and_the_last_value() -> None:
    with pytest.raises(AssertionError, match=r"waiting for the moon \(last: 0\)"):
        wait_for(lambda: 0, what="the moon", timeout=0.05, interval=0.01)


def test_wait_until_returns_the_value_that_passes_and_a_timeout_shows_the_last_one() -> None:
    values = iter([0, 1, 2, 3])
    assert wait_until(lambda: next(values), lambda v: v >= 2, what="two", interval=0) == 2
    falsy = iter([None, 0])  # the passing value is returned even when it is falsy
    assert wait_until(lambda: next(falsy), lambda v: v == 0, what="zero", interval=0) == 0
    rising = itertools.count()
    with pytest.raises(AssertionError, match=r"waiting for a miracle \(last: \{'n': \d+\}\)"):
        wait_until(lambda: {"n": next(rising)}, lambda v: v["n"] < 0, what="a miracle",
                   timeout=0.05, interval=0.01)  # fmt: skip
    with pytest.raises(AssertionError, match=r"^the check's own$"):
        wait_until(lambda: 1, lambda v: (_ for _ in ()).throw(AssertionError("the check's own")),
                   what="x", interval=0)  # fmt: skip


def test_the_async_poll_awaits_its_check_and_lets_the_loop_run_meanwhile() -> None:
    async def scenario() -> tuple[str, int]:
        done = asyncio.Event()

        async def later() -> None:
            await asyncio.sleep(0.05)  # other work on the loop, the thing the poll must let run
            done.set()

        task = asyncio.create_task(later())  # runs only if the poll yields to the loop
        flag = await wait_for_async(
            lambda: "set" if done.is_set() else None, what="the flag", timeout=5
        )
        await task
        calls = itertools.count()

        async def third_time() -> int:
            n = next(calls)
            if n == 0:
                raise ApiException(404)
            return n if n >= 2 else 0

        return flag, await wait_for_async(third_time, what="a count", interval=0)

    assert asyncio.run(scenario()) == ("set", 2)


def test_the_async_poll_times_out_clearly_and_lets_other_errors_through() -> None:
    with pytest.raises(AssertionError, match=r"waiting for the sun \(last: None\)"):
        asyncio.run(wait_for_async(lambda: None, what="the sun", timeout=0.05, interval=0.01))
    with pytest.raises(ApiException):
        asyncio.run(wait_for_async(lambda: (_ for _ in ()).throw(ApiException(500)), what="x"))
