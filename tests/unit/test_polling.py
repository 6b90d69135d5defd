"""The tests' polling helper works in every tier (no kubernetes needed) and fails clearly."""

from __future__ import annotations

import itertools

import pytest

from tests.polling import wait_for


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
