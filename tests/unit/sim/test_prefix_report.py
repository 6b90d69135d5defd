"""The prefix-cache bench's arithmetic (bench/prefix_report.py)."""

from __future__ import annotations

from bench import prefix_report as report


def test_the_oracle_counts_whole_blocks_an_earlier_request_computed() -> None:
    turn1 = list(range(10))
    reply1 = [*turn1, 50, 51, 52]  # what turn 1 computed: its prompt and its reply
    turn2 = [*reply1, 60, 61, 62, 63]  # the history and a new message
    other = [900, 901, 902, 903, 904]
    hits = report.oracle_hit_tokens([turn1, turn2, other, turn2],
                                    [reply1, [*turn2, 70], other, turn2], 4)  # fmt: skip
    # turn 1: nothing earlier; turn 2 (17 tokens): blocks [0:4], [4:8], [8:12] of turn 1's
    # 13 computed tokens; other: nothing; turn 2 again: four whole blocks of what the first
    # turn 2 computed, its 17th token left to compute
    assert hits == [0, 12, 0, 16]


def test_the_oracle_leaves_one_prompt_token_to_compute() -> None:
    prompt = list(range(8))
    assert report.oracle_hit_tokens([prompt, prompt], [prompt, prompt], 4) == [0, 4]


def test_ttft_summaries_and_ratios() -> None:
    turns = [report.Turn(0, k, 0.1 * (k + 1), "x", 10, 0) for k in range(5)]
    turns.append(report.Turn(1, 3, 9.0, "", 10, 0, error="boom"))
    later = report.ttft_summary(turns)
    assert later["n"] == 4 and abs(later["p50"] - 0.35) < 1e-9
    assert report.ttft_summary(turns, from_turn=0)["n"] == 5
    assert report.ttft_summary([])["n"] == 0
    assert report.paired_ratio([2.0, 3.0], [1.0, 1.0]) == {"mean": 2.5, "min": 2.0, "max": 3.0}


def test_texts_equal_per_turn() -> None:
    a = [report.Turn(0, 0, 0.1, "hi", 3, 0), report.Turn(0, 1, 0.1, "yo", 9, 8)]
    b = [report.Turn(0, 1, 0.2, "yo", 9, 0), report.Turn(0, 0, 0.3, "hi", 3, 0)]
    assert report.texts_equal(a, b)
    assert not report.texts_equal(a, [b[0], report.Turn(0, 0, 0.3, "ho", 3, 0)])
