"""Tokens' logprobs in OpenAI's two response shapes (completions and chat), the same for a
whole reply and for one stream chunk. A token's text is its own decoding."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from genpool_worker.engine_io import Tokenizer
from genpool_worker.sampling_params import TokenLogprobs

Tokens = Sequence[tuple[int, TokenLogprobs | None]]


def completion_logprobs(
    tokenizer: Tokenizer, tokens: Tokens, text_offset: int = 0
) -> dict[str, Any]:
    """``{tokens, token_logprobs, top_logprobs, text_offset}`` (offsets into the choice's text,
    from ``text_offset``: a stream chunk continues where the last ended)."""
    texts, offsets, values, tops = [], [], [], []
    offset = text_offset
    for token, logprobs in tokens:
        text = tokenizer.decode([token])
        texts.append(text)
        offsets.append(offset)
        offset += len(text)
        values.append(None if logprobs is None else logprobs.logprob)
        tops.append(None if logprobs is None else
                    {tokenizer.decode([alt]): value for alt, value in logprobs.top})  # fmt: skip
    return {"tokens": texts, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(tokenizer: Tokenizer, tokens: Tokens) -> dict[str, Any]:
    """``{content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}``."""

    def entry(token: int, logprob: float | None) -> dict[str, Any]:
        text = tokenizer.decode([token])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    content = []
    for token, logprobs in tokens:
        top = [] if logprobs is None else [entry(alt, value) for alt, value in logprobs.top]
        value = None if logprobs is None else logprobs.logprob
        content.append(entry(token, value) | {"top_logprobs": top})
    return {"content": content}
