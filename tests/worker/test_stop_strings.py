"""Stop strings over streamed text: the client sees exactly the text before the first
stop string, however the text is split into deltas."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from genpool_worker.stop_strings import StopMatcher


def run(stops: tuple[str, ...], deltas: list[str]) -> tuple[str, bool]:
    matcher = StopMatcher(stops)
    sent = "".join(matcher.feed(delta) for delta in deltas)
    return sent + matcher.flush(), matcher.is_stopped


def expected(stops: tuple[str, ...], text: str) -> tuple[str, bool]:
    """Character by character: stop as soon as the text so far ends with a stop string."""
    for end in range(1, len(text) + 1):
        done = [stop for stop in stops if text[:end].endswith(stop)]
        if done:
            return text[: end - max(len(stop) for stop in done)], True
    return text, False


def test_a_stop_string_split_across_deltas_is_never_sent() -> None:
    matcher = StopMatcher(("END",))
    assert matcher.feed("abc E") == "abc "  # "E" may start "END": held back
    assert matcher.feed("N") == ""
    assert matcher.feed("D tail") == ""
    assert matcher.is_stopped and matcher.flush() == ""


def test_a_held_prefix_that_does_not_match_is_released() -> None:
    matcher = StopMatcher(("END",))
    assert matcher.feed("xE") == "x"
    assert matcher.feed("Nx") == "ENx"
    assert matcher.feed("EN") == ""
    assert matcher.flush() == "EN" and not matcher.is_stopped


def test_the_first_completed_stop_string_wins() -> None:
    assert run(("bb", "a"), ["xxbb", "a"]) == ("xx", True)
    assert run(("a", "\naa"), ["\naa"]) == ("\n", True)  # as if streamed one by one
    assert run(("xa", "a"), ["xa"]) == ("", True)  # same end: the longer one
    assert run(("\n\n", "User:"), ["Hi", " there\n", "\nUser: x"]) == ("Hi there", True)


@pytest.mark.parametrize("stops", [(), ("",), ("ok", "")])
def test_empty_stop_strings_are_refused(stops: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        StopMatcher(stops)


@given(
    text=st.text(alphabet="abc\n", max_size=40),
    stops=st.lists(st.text(alphabet="abc\n", min_size=1, max_size=4), min_size=1, max_size=4),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=12),
)
def test_any_split_of_the_text_gives_the_text_before_the_first_completed_stop(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    deltas = [text[a:b] for a, b in itertools.pairwise(bounds)]
    assert run(tuple(stops), deltas) == expected(tuple(stops), text)
