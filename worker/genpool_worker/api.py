"""HTTP bodies of the worker API, validated with pydantic (unknown fields rejected)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from genpool_worker.edge_limits import (
    MAX_COUNT,
    MAX_SEED,
    check_token_ids,
    int_as_float,
)
from genpool_worker.sampling_params import (
    MAX_LOGPROBS,
    MAX_REPETITION_PENALTY,
    MAX_TOP_K,
    MIN_REPETITION_PENALTY,
    SamplingParams,
)

MAX_BODY_BYTES = 1 << 20
MAX_TEMPERATURE = 2.0
# Clients and workers do not share a clock: an arrival stamped this far in the
# future is clamped to now; further is a client bug and rejected.
ARRIVAL_SKEW_TOLERANCE_S = 5.0
# An arrival stamp older than this is clamped to it (docs/design.md#keyed-by-default): by
# default the clock skew a router's stamp is allowed ahead, allowed behind too.
DEFAULT_MAX_ARRIVAL_AGE_S = ARRIVAL_SKEW_TOLERANCE_S
# What keyed a request (arrival_key.py), most trusted first; a metric label too.
ArrivalSource = Literal["header", "body", "receipt", "unkeyed"]
ARRIVAL_SOURCES: tuple[ArrivalSource, ...] = ("header", "body", "receipt", "unkeyed")
MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_CHOICES = 16  # n, and n x prompts of one completions request
MAX_STOP_TOKEN_IDS = 64
# OpenAI fields this server refuses on purpose, and why (a 422 that says so).
UNSUPPORTED = {
    "response_format": "structured output is not supported (text only)",
    "tools": "tool calling is not supported",
    "tool_choice": "tool calling is not supported",
    "functions": "function calling is not supported",
    "function_call": "function calling is not supported",
    "parallel_tool_calls": "tool calling is not supported",
    "logit_bias": "logit_bias is not supported",
    "suffix": "suffix (insertion) is not supported",
    "best_of": "best_of is not supported (use n)",
}
FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                "repetition_penalty")  # fmt: skip


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
        return int_as_float(value)

    @model_validator(mode="after")
    def _times(self) -> GenPoolTiming:
        _finite_time(self.arrival_time, "arrival_time")
        _finite_time(self.first_token_time, "first_token_time")
        return self


class StreamOptions(BaseModel):
    """OpenAI's ``include_usage`` (a usage-only chunk before ``[DONE]``) and vLLM's
    ``continuous_usage_stats`` (every chunk carries its choice's usage so far), which
    guidellm sends."""

    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False
    continuous_usage_stats: bool = False


class GenerationRequest(BaseModel):
    """What both completion endpoints take besides the prompt (OpenAI subset + extensions)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    temperature: float = Field(default=0.0, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1, le=MAX_TOP_K)  # 0 or -1 (vLLM's spelling): off
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(
        default=1.0, ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY
    )
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    ignore_eos: bool = False  # EOS never ends the reply (its length limit does)
    stop_token_ids: list[int] | None = Field(default=None, max_length=MAX_STOP_TOKEN_IDS)
    stream: bool = False
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    model: str | None = None
    user: str | None = None
    genpool: GenPoolTiming | None = None
    # ``{"ttft_ms", "tpot_ms"}``: checked by slo_request (a bad value is a 400 naming it)
    slo: dict[str, object] | None = None
    # llm-d's P/D protocol (docs/pd.md): a prefill leg, or the handle of one; checked by
    # genpool_worker.pd.handle (a malformed handle is a 400 naming its field).
    kv_transfer_params: dict[str, object] | None = None
    # EOS and stop tokens are masked until this many are out (vLLM's rule)
    min_tokens: int = Field(default=0, ge=0, le=MAX_COUNT)
    # Refused on purpose (``UNSUPPORTED`` says why); a None is accepted (SDKs send it).
    response_format: object | None = None
    tools: object | None = None
    tool_choice: object | None = None
    functions: object | None = None
    function_call: object | None = None
    parallel_tool_calls: object | None = None
    logit_bias: object | None = None

    @field_validator(*FLOAT_FIELDS, mode="before")
    @classmethod
    def _int_is_float(cls, value: object) -> object:
        return int_as_float(value)

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids_in_vocab(cls, value: list[int] | None, info: ValidationInfo) -> list[int] | None:
        return None if value is None else check_token_ids(value, info)

    @field_validator(*FLOAT_FIELDS)
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be finite")
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
    def _refused(self) -> GenerationRequest:
        for name, why in UNSUPPORTED.items():
            if getattr(self, name, None) is not None:
                raise ValueError(f"{name}: {why}")
        return self

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def num_logprobs(self) -> int | None:
        """Alternatives per token the reply reports (None: no logprobs); per route."""
        return None

    def sampling_params(self, choice: int = 0) -> SamplingParams:
        """Choice ``choice`` of ``n`` draws with ``seed + choice`` (choices differ, each
        reproducible)."""
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, top_k=max(self.top_k, 0),
            min_p=self.min_p, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            seed=None if self.seed is None else (self.seed + choice) % 2**63,
            num_logprobs=self.num_logprobs(),
        )  # fmt: skip


class CompletionRequest(GenerationRequest):
    """OpenAI ``/v1/completions`` subset: one prompt (text or token ids) or a list of them."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = Field(default=16, ge=1, le=MAX_COUNT)
    # llm-d's sidecar sets it
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    # OpenAI's and llm-d's sidecar send it here too; include_usage adds the usage chunk.
    stream_options: StreamOptions | None = None
    suffix: object | None = None
    best_of: int | None = None

    def num_logprobs(self) -> int | None:
        return self.logprobs

    def prompts(self) -> list[str | list[int]]:
        """Each prompt of the request (a list of strings or of token-id lists is several)."""
        prompt = self.prompt
        if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
            return [prompt]  # type: ignore[list-item]
        return list(prompt)

    @model_validator(mode="after")
    def _choices(self) -> CompletionRequest:
        if len(self.prompts()) * self.n > MAX_CHOICES:
            raise ValueError(f"prompts x n must be at most {MAX_CHOICES}")
        if self.echo and self.logprobs is not None:
            raise ValueError("echo with logprobs (prompt logprobs) is not supported")
        if self.best_of not in (None, self.n):
            raise ValueError("best_of is not supported (use n)")
        return self

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
    def _non_empty(
        cls, value: str | list[int] | list[str] | list[list[int]], info: ValidationInfo
    ) -> str | list[int] | list[str] | list[list[int]]:
        if len(value) == 0 or any(len(p) == 0 for p in value if not isinstance(p, int)):
            raise ValueError("prompt must not be empty")
        for prompt in [value] if isinstance(value, str) or isinstance(value[0], int) else value:
            if not isinstance(prompt, str):
                check_token_ids(prompt, info)
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


class ChatCompletionRequest(GenerationRequest):
    """OpenAI ``/v1/chat/completions`` subset. Without a length limit a reply may run
    to the model's context (``max_seq_len``), as OpenAI's does."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @model_validator(mode="after")
    def _one_length_limit(self) -> ChatCompletionRequest:
        limits = {self.max_tokens, self.max_completion_tokens} - {None}
        if len(limits) > 1:
            raise ValueError("max_tokens and max_completion_tokens differ: send one")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def length_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class DrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    timeout_s: float = Field(default=60.0, gt=0.0, le=3600.0)

    @field_validator("timeout_s", mode="before")
    @classmethod
    def _int_ok(cls, value: object) -> object:
        return int_as_float(value)
