"""The prefill side's exports (docs/pd.md#the-pull): one pull each; whichever of pull
done, pull broken, cancel, expiry or shutdown comes first releases the blocks, once."""

from __future__ import annotations

import pytest

from genpool_worker.host_port import parse_endpoint
from genpool_worker.pd.endpoints import Prefillers, header_endpoint
from genpool_worker.pd.exports import ExportRegistry


class Recorder:
    def __init__(self) -> None:
        self.released: list[str] = []
        self.outcomes: list[str] = []
        self.now = 100.0


def make_registry(timeout_s: float = 5.0) -> tuple[ExportRegistry, Recorder]:
    seen = Recorder()
    registry = ExportRegistry(seen.released.append, timeout_s=timeout_s,
                              on_outcome=seen.outcomes.append, clock=lambda: seen.now)  # fmt: skip
    return registry, seen


def test_a_pull_claims_once_and_releases_when_it_ends() -> None:
    registry, seen = make_registry()
    registry.add("t1", "req-1", (4, 5), 20, 42)
    assert registry.num_held == 1
    export = registry.claim("t1")
    assert export is not None and export.blocks == (4, 5)
    assert registry.claim("t1") is None  # a second pull gets nothing
    assert registry.cancel("t1") is False  # a pull under way is left to finish
    registry.finish("t1", is_ok=True)
    registry.finish("t1", is_ok=True)
    assert seen.released == ["req-1"] and seen.outcomes == ["ok"] and registry.num_held == 0


def test_a_broken_pull_releases_as_failed() -> None:
    registry, seen = make_registry()
    registry.add("t1", "req-1", (0,), 3, 7)
    registry.claim("t1")
    registry.finish("t1", is_ok=False)
    assert seen.released == ["req-1"] and seen.outcomes == ["failed"]


def test_cancel_and_expiry_release_what_was_never_pulled() -> None:
    registry, seen = make_registry(timeout_s=5.0)
    registry.add("t1", "req-1", (0,), 3, 7)
    registry.add("t2", "req-2", (1,), 3, 7)
    assert registry.cancel("t1") is True
    seen.now += 4.9
    assert registry.sweep() == 0
    seen.now += 0.2
    assert registry.sweep() == 1 and registry.claim("t2") is None
    assert seen.released == ["req-1", "req-2"] and seen.outcomes == ["cancelled", "expired"]


def test_shutdown_releases_everything_once() -> None:
    registry, seen = make_registry()
    registry.add("t1", "req-1", (0,), 3, 7)
    registry.add("t2", "req-2", (1,), 3, 7)
    registry.claim("t2")
    registry.release_all()
    registry.finish("t2", is_ok=True)  # the pull's own end after shutdown: nothing more
    assert sorted(seen.released) == ["req-1", "req-2"] and registry.num_held == 0


def test_endpoints_are_checked_and_cycled() -> None:
    assert parse_endpoint(" 10.0.0.5:8000 ") == "10.0.0.5:8000"
    assert parse_endpoint("[fd00::1]:8000") == "[fd00::1]:8000"
    assert header_endpoint("10.0.0.5:8000,10.0.0.6:8000") == "10.0.0.5:8000"
    for bad in ("10.0.0.5", "10.0.0.5:0", "10.0.0.5:http", "a b:80", ":80"):
        with pytest.raises(ValueError):
            parse_endpoint(bad)
    prefillers = Prefillers(["a:1", "b:2"])
    assert [prefillers.next() for _ in range(3)] == ["a:1", "b:2", "a:1"]
    prefillers.replace([])
    assert prefillers.next() is None
    with pytest.raises(ValueError):
        prefillers.replace(["ok:1", "bad"])
    assert prefillers.endpoints == ()  # a refused replace changes nothing
