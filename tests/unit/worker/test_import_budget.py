"""The decode side's caps on pulled KV (docs/pd.md#the-pull): pulls in flight and bytes
held, each refused past its cap with the flag named, nothing reserved by a refusal."""

from __future__ import annotations

import asyncio

import pytest

from genpool_worker.pd.import_budget import ImportBudget, ImportCapReached


def test_pulls_and_bytes_are_capped_and_freed() -> None:
    budget = ImportBudget(max_pulls=2, max_bytes=100)
    budget.start_pull(60)
    with pytest.raises(ImportCapReached, match="--max-kv-import-bytes=100"):
        budget.start_pull(41)
    budget.start_pull(40)
    with pytest.raises(ImportCapReached, match="--max-kv-pulls=2"):
        budget.start_pull(0)
    assert (budget.num_pulls, budget.num_bytes) == (2, 100)
    budget.end_pull(60, 60)  # pulled whole: the bytes stay held until written
    budget.end_pull(0, 40)  # broke: its reservation goes back
    assert (budget.num_pulls, budget.num_bytes) == (0, 60)
    budget.release(60)  # written into the request's blocks
    assert budget.num_bytes == 0
    with pytest.raises(ValueError):
        ImportBudget(max_pulls=0)


def test_past_the_pull_cap_a_pull_waits_its_turn_then_gives_up() -> None:
    async def scenario() -> list[str]:
        budget = ImportBudget(max_pulls=2, max_bytes=100)
        order: list[str] = []
        started = {name: asyncio.Event() for name in "abc"}
        ends = {name: asyncio.Event() for name in "abc"}

        async def one(name: str) -> None:
            await budget.start_pull_in_turn(10, timeout_s=5)
            order.append(f"{name} started")
            started[name].set()
            await ends[name].wait()
            budget.end_pull_in_turn(0, 10)

        tasks = {name: asyncio.create_task(one(name)) for name in "abc"}
        await started["a"].wait()
        await started["b"].wait()  # a and b hold both pulls; c waits its turn
        assert budget.num_pulls == 2 and order == ["a started", "b started"]
        ends["a"].set()  # a's pull ends: c's turn
        await started["c"].wait()
        assert order == ["a started", "b started", "c started"]
        ends["c"].set()
        await asyncio.gather(tasks["a"], tasks["c"])
        await budget.start_pull_in_turn(10, timeout_s=0.05)  # with b's: both pulls taken
        with pytest.raises(ImportCapReached, match=r"in flight for 0\.05 s"):
            await budget.start_pull_in_turn(10, timeout_s=0.05)  # no turn comes: refused
        assert budget.num_pulls == 2  # the refusal reserved nothing
        ends["b"].set()
        await tasks["b"]
        return order

    assert len(asyncio.run(scenario())) == 3
