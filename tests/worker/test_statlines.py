"""``GET /statlines``: the worker's recent periodic stat lines, oldest first, each window
once, at most ``RECENT_STAT_LINES`` (what the operator counts windows from)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

from genpool_core.names import RECENT_STAT_LINES
from genpool_core.statline import StatLine, parse_statline, parse_statlines
from tests.polling import wait_until
from tests.worker.conftest import RunningWorker


def test_statlines_are_the_recent_periods_oldest_first(
    worker_factory: Callable[..., RunningWorker],
) -> None:
    worker: RunningWorker = worker_factory(
        stat_interval_s=0.2
    )  # above the line's 0.1 s resolution of t
    with worker.client() as client:
        assert parse_statlines(client.get("/statlines").text) == []  # before the first period

    async def load() -> None:
        async with worker.async_client() as client:
            body = {"prompt": "x", "max_tokens": 60}
            await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(8)))

    with worker.client() as client:

        def after_load() -> list[StatLine]:
            asyncio.run(load())  # passes cut the lines: the engine must be busy
            return parse_statlines(client.get("/statlines").text)

        lines = wait_until(after_load, lambda got: len(got) == RECENT_STAT_LINES,
                           "a full ring of stat lines", 120)  # fmt: skip
        assert len(after_load()) == RECENT_STAT_LINES  # more periods: still the last 16
        times = [line.t for line in lines]
        assert times == sorted(times) and len(set(times)) == len(times)
        newest = parse_statline(client.get("/statline").text)
        assert newest is not None and newest.t >= times[-1]
        # consecutive windows: each line's completed total grows by its own window's count
        for older, newer in itertools.pairwise(lines):
            assert newer.completed_total - older.completed_total == newer.completed_window
