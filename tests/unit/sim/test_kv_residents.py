"""bench/kv_residents.py: residents one H200's KV admits through the core, paged vs static
(needs the Azure trace in ../shared/data; fails if it is missing)."""

from __future__ import annotations

from bench import kv_residents
from genpool_core.kv_blocks import KVBudget


def test_admission_stops_at_the_first_head_that_does_not_fit() -> None:
    budget = KVBudget(10, 16)
    # 15, 33, 33 tokens: 1 + 3 + 3 blocks; then 60 tokens (4 blocks) do not fit, and the
    # 1-block request behind that head waits too (no overtaking)
    admitted = kv_residents.admit([(10, 5), (20, 13), (30, 3), (30, 30), (1, 1)], budget)
    assert [r.request_id for r in admitted] == ["r0", "r1", "r2"]
    assert [len(r.blocks) for r in admitted] == [1, 3, 3]
    assert len(kv_residents.static_residents(budget, 64)) == 2  # 4 blocks a resident


def test_quick_run_has_its_shape_and_paged_admits_more() -> None:
    result = kv_residents.run(quick=True)
    assert result["budget"]["num_blocks"] == 51498 and result["budget"]["block_size"] == 16
    assert result["static"]["residents"] == 51498 // (8192 // 16)  # 100, by construction
    assert 1.07 < result["static"]["gb_per_resident"] < 1.08
    draws = result["paged_draws"]
    assert result["draws"] == 3 and draws["residents"]["min"] > result["static"]["residents"]
    assert result["ratio"]["mean"] > 1 and result["ratio"]["ci95"] > 0  # draws differ
    assert 0 < draws["gb_per_resident"]["mean"] < result["static"]["gb_per_resident"]
    assert 0 <= draws["rounding_waste"]["mean"] < 0.05
    assert result["paged_in_trace_order"] > result["static"]["residents"]
    assert "ratio" in kv_residents.format_table(result)
