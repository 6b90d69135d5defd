"""Incremental detokenization (genpool_worker/detokenizer.py): the text streamed a few
tokens at a time is the text of the whole output, with multi-byte characters split
across tokens, a tokenizer that drops a sequence's leading space, stop tokens and EOS;
and a token costs a decode of a short window, not of the output so far."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from genpool_core.request import FinishReason
from genpool_worker.detokenizer import INCOMPLETE_UTF8, IncrementalDetokenizer
from genpool_worker.engine_io import Arrival, EngineRequest
from genpool_worker.events import EngineEvent, TokenDelta
from genpool_worker.output_processor import OutputProcessor


class ByteTokenizer:
    """One token a byte (a character may take several); counts what it decodes."""

    eos_token_id = 0

    def __init__(self) -> None:
        self.decoded = 0  # tokens decoded, all calls together

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int]) -> str:
        self.decoded += len(ids)
        return bytes(ids).decode(errors="replace")


class WordTokenizer:
    """SentencePiece's shape: a token is "▁word", and a decoded sequence drops its first
    leading space, so decoding a window alone loses the space between two windows."""

    eos_token_id = 0
    words = ("", "hello", "world", "again", ",", "ok")

    def encode(self, text: str) -> list[int]:
        return [self.words.index(w) for w in text.split()]

    def decode(self, ids: list[int]) -> str:
        return "".join(" " + self.words[i] for i in ids).removeprefix(" ")


def _streamed(tokenizer: ByteTokenizer | WordTokenizer, ids: list[int]) -> list[str]:
    detokenizer = IncrementalDetokenizer()
    pieces = []
    for token in ids:
        detokenizer.ids.append(token)
        pieces.append(detokenizer.new_text(tokenizer, len(detokenizer.ids)))
    pieces.append(detokenizer.new_text(tokenizer, len(detokenizer.ids), is_final=True))
    return pieces


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_streamed_text_is_the_whole_texts_even_across_split_characters(text: str) -> None:
    tokenizer = ByteTokenizer()
    pieces = _streamed(tokenizer, tokenizer.encode(text))
    assert "".join(pieces) == text
    assert not any(INCOMPLETE_UTF8 in piece for piece in pieces if piece), "half a character"


@given(st.lists(st.integers(1, len(WordTokenizer.words) - 1), max_size=20))
def test_a_tokenizer_that_drops_a_leading_space_keeps_the_spaces_between_windows(
    ids: list[int],
) -> None:
    tokenizer = WordTokenizer()
    assert "".join(_streamed(tokenizer, ids)) == tokenizer.decode(ids)


def test_an_incomplete_character_at_the_end_goes_out_only_when_the_output_ends() -> None:
    tokenizer = ByteTokenizer()
    detokenizer = IncrementalDetokenizer()
    detokenizer.ids += list("é".encode())[:1]
    assert detokenizer.new_text(tokenizer, 1) == ""
    assert detokenizer.new_text(tokenizer, 1, is_final=True) == INCOMPLETE_UTF8


def test_a_token_decodes_a_window_not_the_whole_output() -> None:
    tokenizer = ByteTokenizer()
    _streamed(tokenizer, tokenizer.encode("a" * 2000))
    # Two decodes a token over at most two tokens each (a whole-output decode: ~2M).
    assert tokenizer.decoded <= 4 * 2000


def test_the_output_processor_streams_the_text_without_eos_and_a_final_stop_token() -> None:
    tokenizer = ByteTokenizer()
    output = OutputProcessor(tokenizer, eos_token_ids=(0,))
    request = EngineRequest(Arrival("r", [1], max_tokens=16, stop_token_ids=(ord("!"),)))
    events: list[EngineEvent] = []
    request.emit = events.append  # type: ignore[method-assign]
    for token in [*"ça va".encode(), 0, *b"!"]:
        output.on_token(request, token)
    output.on_finished(request, FinishReason.STOP)
    assert "".join(e.text for e in events if isinstance(e, TokenDelta)) == "ça va"
    assert request.output_ids[-2:] == [0, ord("!")]  # both counted, neither is text
