"""HTTP bodies of the worker API, validated with pydantic (unknown fields rejected)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_BODY_BYTES = 1 << 20
MAX_TEMPERATURE = 2.0
# Clients and workers do not share a clock: an arrival stamped this far in the
# future is clamped to now; further is a client bug and rejected.
ARRIVAL_SKEW_TOLERANCE_S = 5.0
MAX_STOP_STRINGS = 4  # OpenAI's limit
NEUTRAL_ONLY = {"n": 1, "top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


def _finite_time(value: float | None, name: str) -> float | None:
    if value is not None and not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"{name} must be a finite time >= 0")
    return value


class GenPoolTiming(BaseModel):
    """The ``genpool`` extension: timing metadata from a router or context server."""

    model_config = ConfigDict(extra="forbid", strict=True)

    arrival_time: float | None = Field(default=None, description="Unix seconds at GEN arrival")
    # False: unkeyed on purpose (warm-up, probes); docs/design.md#keyed-by-default
    keyed: bool | None = None
    first_token_time: float | None = Field(default=None, description="Unix s of token 1")

    @field_validator("arrival_time", "first_token_time", mode="before")
    @classmethod
    def _int_ok(cls, value: object) -> object:
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _times(self) -> GenPoolTiming:
        _finite_time(self.arrival_time, "arrival_time")
        _finite_time(self.first_token_time, "first_token_time")
        return self


class GenerationRequest(BaseModel):
    """What both completion endpoints take besides the prompt (OpenAI subset + extensions)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    temperature: float = Field(default=0.0, ge=0.0, le=MAX_TEMPERATURE)
    stream: bool = False
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    model: str | None = None
    user: str | None = None
    genpool: GenPoolTiming | None = None
    # ``{"ttft_ms", "tpot_ms"}``: checked by slo_request (a bad value is a 400 naming it)
    slo: dict[str, object] | None = None
    # llm-d's P/D protocol (docs/pd.md): a prefill leg, or the handle of one; checked by
    # genpool_worker.pd.handle (a malformed handle is a 400 naming its field).
    kv_transfer_params: dict[str, object] | None = None
    min_tokens: int = Field(default=0, ge=0)  # EOS does not end the reply before this many
    # OpenAI knobs the worker does not implement: SDKs send them explicitly, so their
    # neutral values (``NEUTRAL_ONLY``) are accepted and anything else is refused.
    n: int = 1
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @field_validator("temperature", mode="before")
    @classmethod
    def _int_temperature(cls, value: object) -> object:
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("temperature")
    @classmethod
    def _finite_temperature(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("temperature must be finite")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        if not all(stops):
            raise ValueError("stop strings must not be empty")
        return value

    @model_validator(mode="after")
    def _neutral_only(self) -> GenerationRequest:
        for name, neutral in NEUTRAL_ONLY.items():
            if getattr(self, name) != neutral:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is not supported (only {neutral})"
                )
        return self

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class CompletionRequest(GenerationRequest):
    """OpenAI ``/v1/completions`` subset."""

    prompt: str | list[int]
    max_tokens: int = Field(default=16, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)  # llm-d's sidecar sets it

    @model_validator(mode="after")
    def _one_length_limit(self) -> CompletionRequest:
        if self.max_completion_tokens is None:
            return self
        if "max_tokens" in self.model_fields_set and self.max_tokens != self.max_completion_tokens:
            raise ValueError("max_tokens and max_completion_tokens differ: send one")
        self.max_tokens = self.max_completion_tokens
        return self

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, value: str | list[int]) -> str | list[int]:
        if len(value) == 0:
            raise ValueError("prompt must not be empty")
        return value


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def as_template_input(self) -> dict[str, str]:
        """What a chat template reads: ``role`` and ``content`` as text (parts joined)."""
        content = self.content
        text = content if isinstance(content, str) else "".join(p.text for p in content)
        return {"role": self.role, "content": text}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False


class ChatCompletionRequest(GenerationRequest):
    """OpenAI ``/v1/chat/completions`` subset. Without a length limit a reply may run
    to the model's context (``max_seq_len``), as OpenAI's does."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stream_options: StreamOptions | None = None

    @model_validator(mode="after")
    def _one_length_limit(self) -> ChatCompletionRequest:
        limits = {self.max_tokens, self.max_completion_tokens} - {None}
        if len(limits) > 1:
            raise ValueError("max_tokens and max_completion_tokens differ: send one")
        return self

    def length_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class DrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    timeout_s: float = Field(default=60.0, gt=0.0, le=3600.0)

    @field_validator("timeout_s", mode="before")
    @classmethod
    def _int_ok(cls, value: object) -> object:
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value
