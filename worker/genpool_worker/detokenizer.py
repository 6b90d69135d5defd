"""A request's output text, decoded a few tokens at a time (as vLLM's incremental
detokenizer): each new token costs a decode of the tokens since the last complete text
and of the ones just before them, not of the whole output (which made the per-token
host cost grow with the output's length: bench/results/detokenize.json).

Two decodes of the same window start at the same token, ``_prefix``: the text of
``ids[_prefix:_read]`` (out already) and of ``ids[_prefix:end]``; the new text is the
second's tail. Starting both at one token keeps what a tokenizer does at a sequence's
start (a SentencePiece tokenizer drops the first token's leading space) out of the
difference, and the tokens before ``_read`` give the new ones their context. A window
that ends inside a UTF-8 sequence (its text ends with U+FFFD) sends nothing and waits for
the rest. No torch here.
"""

from __future__ import annotations

from typing import Protocol

INCOMPLETE_UTF8 = "\ufffd"  # what a decoder shows for a partial UTF-8 sequence


class Decoder(Protocol):  # the part of engine_io.Tokenizer used here
    def decode(self, ids: list[int]) -> str: ...


class IncrementalDetokenizer:
    def __init__(self) -> None:
        self.ids: list[int] = []  # the tokens that are text (no EOS id)
        self._prefix = 0  # where both decodes start: context for the unread tokens
        self._read = 0  # tokens whose text is out

    def new_text(self, tokenizer: Decoder, end: int, *, is_final: bool = False) -> str:
        """The text ``ids[:end]`` adds to what is out: empty while it ends inside a UTF-8
        sequence, unless ``is_final`` (the request is over: what there is goes out)."""
        if end <= self._read:
            return ""
        sent = tokenizer.decode(self.ids[self._prefix : self._read])
        text = tokenizer.decode(self.ids[self._prefix : end])
        if len(text) <= len(sent) or (text.endswith(INCOMPLETE_UTF8) and not is_final):
            return ""
        self._prefix, self._read = self._read, end
        return text[len(sent) :]
