"""The decode side's caps on pulled KV (docs/pd.md#the-pull): pulls in flight and bytes
held, each refused past its cap with the flag named, nothing reserved by a refusal."""

from __future__ import annotations

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
