"""The llm-d precise prefix-cache interop's load and summary
(genpool_devcluster.interop.conversations): turn k holds turn k-1's prompt and reply, no
two conversations share a first block, and the summary counts a later turn as following
only when it ran where the turn before did."""

from __future__ import annotations

from genpool_core.block_hash import block_hashes
from genpool_devcluster.interop.conversations import Conversation, Turn, summarise, turn_record

BS = 16


def reply(text: str, cached: int = 0) -> dict[str, object]:
    usage = {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": cached}}
    return {"choices": [{"text": text, "message": {"content": text}}], "usage": usage}


def test_each_turn_extends_the_last_with_its_reply() -> None:
    for route in ("completions", "chat"):
        conv = Conversation(3, route)
        first = conv.body(0, "m", 8)
        conv.answered(reply(" an answer"))
        second = conv.body(1, "m", 8)
        if route == "chat":
            assert second["messages"][: len(first["messages"])] == first["messages"]
            assert second["messages"][-2] == {"role": "assistant", "content": " an answer"}
        else:
            assert second["prompt"].startswith(first["prompt"] + " an answer")
        assert second["model"] == "m" and second["max_tokens"] == 8


def test_no_two_conversations_share_a_full_block() -> None:
    """Else a first turn's pick would not be the epp's tie-break (the synthetic
    tokenizer's ids are the prompt's bytes)."""
    firsts = [block_hashes(list(Conversation(c, "completions").body(0, "m", 1)["prompt"]
                                .encode()), BS)[0] for c in range(40)]  # fmt: skip
    assert len(set(firsts)) == len(firsts)


def test_a_later_turn_follows_only_where_the_turn_before_ran() -> None:
    conv = Conversation(0, "completions")
    a, b = "10.0.0.1:8000", "10.0.0.2:8000"
    turns = [
        turn_record(conv, 1, a, None, {a: 0.0, b: 0.0}, reply("x")),
        turn_record(conv, 2, a, a, {a: 0.5, b: 0.0}, reply("x", 48)),
        turn_record(conv, 3, b, a, {a: 0.0, b: 0.0}, reply("x", 0)),
    ]
    assert [t.followed for t in turns] == [None, True, False]
    summary = summarise(turns, BS)
    assert summary["later_turns"] == 2 and summary["followed_previous"] == 1
    assert summary["followed_fraction"] == 0.5
    assert summary["first_turns_by_endpoint"] == {a: 1}
    assert summary["later_turns_with_a_cache_hit"] == 1
    assert summary["later_cached_fraction"] == 0.24  # 48 of 200
    assert summary["picked_score_mean"] == 0.25 and summary["other_score_mean"] == 0.0
    assert isinstance(turns[0], Turn)
