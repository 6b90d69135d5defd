"""bench.speculative's arithmetic: a reply's decode rate and a case's paired summary."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from bench.speculative import Reply, _case


def test_a_replys_rate_is_its_tokens_after_the_first_over_their_time() -> None:
    reply = Reply("code", 0, start=0.0, first=1.0, last=3.0, tokens=21)
    assert reply.rate == pytest.approx(10.0) and reply.ttft == pytest.approx(1.0)
    assert Reply("code", 0, 0.0, 1.0, 1.5, tokens=5).rate is None  # too short to rate
    assert Reply("code", 0, 0.0).rate is None and Reply("code", 0, 0.0).ttft is None


def test_a_case_pairs_the_setups_rep_by_rep_and_compares_their_texts() -> None:
    def run(rate: float, text: str, accepted: float | None) -> dict[str, object]:
        reply = asdict(Reply("code", 0, 0.0, text=text))
        return {"replies": [reply], "rate_p50": rate, "acceptance_rate": accepted,
                "tokens_per_drafting_step": None, "failed": 0}  # fmt: skip

    same = _case({"plain": [run(10.0, "a", None), run(12.0, "a", None)],
                  "ngram": [run(25.0, "a", 0.7), run(24.0, "a", 0.7)],
                  "early_exit": [run(5.0, "a", 0.3), run(6.0, "a", 0.4)]})  # fmt: skip
    assert same["ratio_over_plain"] == {"ngram": [2.5, 2.0], "early_exit": [0.5, 0.5]}
    assert same["acceptance_rate"] == {"ngram": [0.7, 0.7], "early_exit": [0.3, 0.4]}
    assert same["texts_equal"]
    differ = _case({"plain": [run(10.0, "a", None)], "ngram": [run(10.0, "a", 0.1)],
                    "early_exit": [run(10.0, "b", 0.1)]})  # fmt: skip
    assert not differ["texts_equal"]
