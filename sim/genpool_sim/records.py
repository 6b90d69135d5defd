"""Per-request records of a simulation and the metric definitions (docs/design.md#metrics).

Defined once here and in docs/sim.md:
- ``ttft_ctx``       arrival -> first token from the context stage (``first_token_time``)
- ``ttft``           arrival -> first token emitted by the GEN worker (first decode step
                     after admission): the latency the policy attacks
- ``gen_ttft``       GEN arrival -> first token emitted by the GEN worker: the replica
                     scaler's SLO (what the worker itself can see)
- ``admission_wait`` GEN arrival -> (first) admission
- ``tpot``           (last token - first GEN token) / (GEN tokens - 1), pauses included
- ``e2e``            arrival -> last token
- ``output_rate``    (n - 1) / (last token - first_token_time): the SLO's rate
"""

from __future__ import annotations

from dataclasses import dataclass, field

from genpool_core.block_hash import BlockHash
from genpool_core.request import GenRequest


@dataclass(slots=True, eq=False)
class SimRequest:
    request_id: str
    arrival: float
    prompt_tokens: int
    output_tokens: int
    client: int | None = None
    first_token_time: float | None = None
    gen_arrival: float | None = None
    admitted: float | None = None
    first_gen_token: float | None = None
    last_token: float | None = None
    num_pauses: int = 0
    num_evictions: int = 0
    worker: int | None = None
    gen: GenRequest | None = None
    is_done: bool = False
    # ``--classes``: the request's class, and the D_i / T_i it carries to the worker
    slo_class: str | None = None
    slo_ttft_s: float | None = None
    target_output_tps: float | None = None
    # ``--conversations``: its conversation and turn (1-based); the hashes of every full
    # block of its prompt and reply (genpool_sim.conversations); the prompt tokens the
    # prefix cache held at its first admission
    conversation: int | None = None
    turn: int | None = None
    block_hashes: list[BlockHash] = field(default_factory=list)
    cached_tokens: int = 0

    @property
    def ttft_ctx(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival

    @property
    def ttft(self) -> float | None:
        return None if self.first_gen_token is None else self.first_gen_token - self.arrival

    @property
    def gen_ttft(self) -> float | None:
        if self.first_gen_token is None or self.gen_arrival is None:
            return None
        return self.first_gen_token - self.gen_arrival

    @property
    def admission_wait(self) -> float | None:
        if self.admitted is None or self.gen_arrival is None:
            return None
        return self.admitted - self.gen_arrival

    @property
    def e2e(self) -> float | None:
        return None if self.last_token is None else self.last_token - self.arrival

    @property
    def tpot(self) -> float | None:
        gen_tokens = self.output_tokens - 1
        if gen_tokens < 2 or self.first_gen_token is None or self.last_token is None:
            return None
        return (self.last_token - self.first_gen_token) / (gen_tokens - 1)

    @property
    def output_rate(self) -> float | None:
        if self.output_tokens < 2 or self.last_token is None or self.first_token_time is None:
            return None
        span = self.last_token - self.first_token_time
        return float("inf") if span <= 0 else (self.output_tokens - 1) / span
