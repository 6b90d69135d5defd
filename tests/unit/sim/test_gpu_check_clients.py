"""The serving check's summaries (bench/gpu_check_clients.py): what the streams' timestamps
say, on hand-made records (the GPU run itself is proved by tests/worker's smoke run)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from bench.gpu_check_clients import (
    StreamRecord,
    parse_records,
    sampling_summary,
    serving_table,
    split,
    steady_window,
    summarize_wave,
)


def _stream(sent: float, times: list[float], per_chunk: int = 1) -> StreamRecord:
    chunks = [(t, per_chunk) for t in times]
    return StreamRecord(sent, chunks, tokens=per_chunk * len(times), text="w1 " * len(times))


def test_steady_window_counts_what_arrived_while_every_stream_decoded() -> None:
    # a: first token at 1, last at 5; b: first at 2, last at 6. Window (2, 5]: a's 3, 4, 5
    # and b's 3, 4, 5 (b's 2 is its first, at the window's start: not in it).
    a = _stream(0.0, [1.0, 2.0, 3.0, 4.0, 5.0])
    b = _stream(0.5, [2.0, 3.0, 4.0, 5.0, 6.0])
    window = steady_window([a, b])
    assert window == {"steady_s": 3.0, "steady_tokens": 6, "steady_tok_s": 2.0}


def test_steady_window_counts_tokens_not_chunks() -> None:
    a = _stream(0.0, [1.0, 2.0, 3.0], per_chunk=2)  # two tokens a chunk (coalesced)
    assert steady_window([a])["steady_tok_s"] == 2.0  # 4 tokens in (1, 3]


def test_no_steady_window_when_a_stream_ends_before_another_starts() -> None:
    a, b = _stream(0.0, [1.0, 2.0]), _stream(0.0, [3.0, 4.0])
    window = steady_window([a, b])
    assert window["steady_tok_s"] is None and window["steady_s"] == 0.0


def test_summarize_wave_wall_rate_ttft_and_errors() -> None:
    a = _stream(0.0, [0.5, 1.0, 1.5, 2.0])
    b = _stream(0.0, [1.0, 1.5, 2.0, 4.0])
    failed = StreamRecord(0.0, error="APIConnectionError: refused")
    out = summarize_wave([a, b, failed])
    assert (out["streams"], out["complete"], out["errors"]) == (3, 2, 1)
    assert out["first_errors"] == ["APIConnectionError: refused"]
    assert out["output_tokens"] == 8 and out["wall_s"] == 4.0 and out["wall_tok_s"] == 2.0
    assert out["ttft_p50_ms"] == pytest.approx(750.0)  # TTFTs 0.5 and 1.0 s
    assert out["ttft_max_ms"] == 1000.0


def test_summarize_wave_of_failures_only() -> None:
    out = summarize_wave([StreamRecord(0.0, error="x")])
    assert out == {"streams": 1, "complete": 0, "errors": 1, "first_errors": ["x"]}


def test_split_into_client_processes() -> None:
    prompts = [[i] for i in range(5)]
    assert split(prompts, 2) == [[[0], [1]], [[2], [3]], [[4]]]


def test_records_survive_the_process_boundary() -> None:
    record = StreamRecord(1.5, [(2.0, 1), (2.5, 3)], tokens=4, text="w1", error=None)
    assert parse_records(json.dumps([asdict(record)])) == [record]


def test_sampling_summary() -> None:
    greedy = StreamRecord(0.0, text="w1 w1")
    same, again, other = (StreamRecord(0.0, text=t) for t in ("w2 w3", "w2 w3", "w4 w5"))
    out = sampling_summary({"temperature": 0.8}, [same, again, other], greedy)
    assert out["ok"] and out["identical_with_same_seed"] and out["differs_with_other_seed"]
    assert out["differs_from_greedy"]
    refused = StreamRecord(0.0, error="BadRequestError: top_p=0.9 is not supported")
    out = sampling_summary({"top_p": 0.9}, [refused, refused, refused], greedy)
    assert not out["ok"] and out["identical_with_same_seed"] is None
    assert out["errors"][0].startswith("BadRequestError")


def test_serving_table_ratios_to_the_model_only_figure() -> None:
    result = {
        "model_only": {"b1": {"tok_s": 100.0}, "b64": {"tok_s": 4000.0}},
        "serving": {
            "c1": {"steady_tok_s": 90.0, "wall_tok_s": 80.0, "ttft_p50_ms": 10.0},
            "c64": {"error": "TimeoutError: ..."},
        },
    }
    one, sixty_four = serving_table(result, (1, 64))
    assert one["steady_ratio"] == 0.9 and one["wall_ratio"] == 0.8 and one["ttft_p50_ms"] == 10.0
    assert sixty_four["model_only_tok_s"] == 4000.0 and sixty_four["steady_ratio"] is None
    assert serving_table({"model_only": {"error": "x"}}, (1,))[0]["model_only_tok_s"] is None
