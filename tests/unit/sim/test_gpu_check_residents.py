"""gpu_check's residents arithmetic (bench/gpu_check_residents.py): paged vs static KV slots.

It runs without a GPU, so the part of the GPU check a CPU can prove is proved here:
hand-counted small cases, and the Azure trace (needs ../shared/data; fails if missing).
"""

from __future__ import annotations

from bench.gpu_check_residents import azure_residents, residents_at
from genpool_sim.kv_memory import KVShape
from genpool_sim.workload import TraceRequest

ONE_BYTE = KVShape(num_layers=1, num_kv_heads=1, head_dim=1, dtype_bytes=1)  # 2 B a token


def _trace(*lengths: tuple[int, int]) -> list[TraceRequest]:
    return [TraceRequest(float(i), p, o) for i, (p, o) in enumerate(lengths)]


def test_static_reserves_max_seq_len_and_paged_the_rounded_blocks() -> None:
    # 320 bytes = 160 tokens = 10 blocks of 16; static slots of 64 tokens: 2 residents.
    trace = _trace((10, 5), (20, 13), (30, 3), (60, 30))  # 15, 33, 33 tokens; 90 too long
    row = residents_at(trace, kv_bytes=320, shape=ONE_BYTE, block_size=16, max_seq_len=64)
    assert row["static_residents"] == 2
    assert row["served_share"] == 0.75
    assert row["mean_reserved_tokens"] == (16 + 48 + 48) / 3  # 1, 3 and 3 blocks
    assert row["paged_residents_mean"] == 4  # 10 blocks / (7 / 3)
    assert row["paged_residents_in_order"] == 3  # 1 + 3 + 3 = 7 <= 10
    assert row["ratio_in_order"] == 1.5


def test_in_order_stops_at_the_first_request_that_does_not_fit() -> None:
    trace = _trace((100, 60), (1, 1), (1, 1))  # 160 tokens: every block, then none left
    row = residents_at(trace, kv_bytes=320, shape=ONE_BYTE, block_size=16, max_seq_len=160)
    assert row["static_residents"] == 1 and row["paged_residents_in_order"] == 1


def test_azure_lengths_fit_several_times_more_residents_paged() -> None:
    result = azure_residents()
    assert result["requests"] == 19366 and result["kv_bytes_per_token"] == 131072
    for row in result["rows"]:
        assert row["paged_residents_mean"] > 3 * row["static_residents"]
        # block rounding costs at most a block per request
        assert row["mean_tokens"] <= row["mean_reserved_tokens"]
        assert row["mean_reserved_tokens"] < row["mean_tokens"] + row["block_size"]
