"""How one request samples its tokens (OpenAI's and vLLM's knobs), checked once; the
runner's batched sampler (``model.sampler``) applies them. No torch here."""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit (completions' logprobs: 5; we allow 20)
# vLLM's rule: a temperature below this samples greedily. Dividing logits by less overflows
# float32 to inf and the softmax to NaN.
GREEDY_TEMPERATURE = 1e-5
# Below this a repetition penalty's division makes a logit inf (float32 tops out at 3e38).
MIN_REPETITION_PENALTY = 0.01
MAX_REPETITION_PENALTY = 10.0
# top_k past the vocabulary filters nothing (the sampler clamps it); the bound keeps the
# value a 32-bit integer wherever it goes.
MAX_TOP_K = 2**31 - 1


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """``temperature`` below ``GREEDY_TEMPERATURE`` is greedy (penalties still apply:
    argmax of the penalised logits). ``top_k`` 0 and ``top_p`` 1 and ``min_p`` 0 filter
    nothing. ``seed``: the request's draws (None: a stable seed from its id, the same on
    every rank). ``num_logprobs``: alternatives reported per token (None: no logprobs;
    0: only the chosen token's)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    num_logprobs: int | None = None

    def __post_init__(self) -> None:
        checks = (
            ("temperature", 0.0 <= self.temperature <= 2.0, "in [0, 2]"),
            ("top_p", 0.0 < self.top_p <= 1.0, "in (0, 1]"),
            ("top_k", 0 <= self.top_k <= MAX_TOP_K, f"in [0, {MAX_TOP_K}] (0: off)"),
            ("min_p", 0.0 <= self.min_p <= 1.0, "in [0, 1]"),
            ("presence_penalty", -2.0 <= self.presence_penalty <= 2.0, "in [-2, 2]"),
            ("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0, "in [-2, 2]"),
            (
                "repetition_penalty",
                MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY,
                f"in [{MIN_REPETITION_PENALTY}, {MAX_REPETITION_PENALTY}]",
            ),
        )
        for name, is_ok, rule in checks:
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and is_ok):
                raise ValueError(f"{name} must be {rule}, got {value!r}")
        if self.num_logprobs is not None and not 0 <= self.num_logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be 0..{MAX_LOGPROBS}, got {self.num_logprobs}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def has_penalties(self) -> bool:
        return (
            bool(self.presence_penalty or self.frequency_penalty) or self.repetition_penalty != 1.0
        )

    @property
    def is_filtered(self) -> bool:
        return self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """A sampled token's logprob and the most likely alternatives, best first (token id,
    logprob), from the model's own logits."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()
