"""What the engine tells one request's HTTP handler, in this order: ``Accepted`` or
``Rejected``; then ``TokenDelta`` events; then ``Finished`` (or ``Failed``: the request
failed in the engine, or the loop died). Typed, so the server matches on types instead
of tuple positions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from genpool_core.request import FinishReason
from genpool_worker.sampling_params import TokenLogprobs


@dataclass(frozen=True, slots=True)
class Accepted:
    """The scheduler queued the request."""


@dataclass(frozen=True, slots=True)
class Rejected:
    """The scheduler refused the request: ``status`` is the HTTP status to answer."""

    status: int
    message: str


@dataclass(frozen=True, slots=True)
class TokenDelta:
    """Newly decoded text (complete UTF-8 only), and the tokens it completes with their
    logprobs when the request asked for them (None: a token whose logprob is not known
    here, e.g. a pulled request's first token)."""

    text: str
    logprobs: tuple[tuple[int, TokenLogprobs | None], ...] = ()
    num_output_tokens: int = 0  # the request's output tokens so far (continuous usage)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens the prefix cache held (not computed)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, Any]:
        """OpenAI's usage object, with ``prompt_tokens_details.cached_tokens`` (vLLM's;
        llm-d's sidecar forwards it)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


@dataclass(frozen=True, slots=True)
class Finished:
    """The last event of a request that ran: why it ended and what it used."""

    reason: FinishReason
    usage: Usage


@dataclass(frozen=True, slots=True)
class Failed:
    """The request will get nothing more: ``status`` 503 when the engine loop died or the
    worker stopped (every request fails at once), 500 when this request alone failed
    inside the engine (the others go on)."""

    message: str
    status: int = 503


EngineEvent = Accepted | Rejected | TokenDelta | Finished | Failed
