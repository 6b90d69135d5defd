"""A simulated pool's settings: ``ClusterConfig`` (the GEN workers' shape, mode, knobs
and KV budget; ``genpool_sim.cluster`` runs it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from genpool_core.field_help import DESCRIPTION
from genpool_core.knobs import DEFAULT_PAUSED_CAP_FRACTION, default_paused_cap
from genpool_core.kv_blocks import KVBudget
from genpool_core.names import DEFAULT_KV_BLOCK_SIZE, DEFAULT_STAT_INTERVAL_S, OFF_MODE
from genpool_core.stepmodel import DEFAULT_STEP_MODEL, StepModel
from genpool_sim.modes import MODES, SimMode


@dataclass(frozen=True)
class ClusterConfig:
    mode: str = OFF_MODE
    workers: int = field(default=8, metadata={DESCRIPTION: "GEN workers (replicas) at the start"})
    max_batch: int = 16
    ctx_servers: int = field(
        default=4, metadata={DESCRIPTION: "context (prefill) servers ahead of the GEN pool"}
    )
    kv_transfer_s_per_token: float = field(
        default=0.0,
        metadata={
            DESCRIPTION: "P/D: seconds per prompt token a GEN worker's pull of the context"
            " stage's KV takes; the request is keyed at its handoff and queues once its KV is"
            " in (0: an instant handoff)"
        },
    )
    target_output_tps: float | None = None
    tpot_budget: float = 0.1
    paused_cap_fraction: float = field(
        default=DEFAULT_PAUSED_CAP_FRACTION,
        metadata={DESCRIPTION: "P (paused cap) as a fraction of A, at the start"},
    )
    stat_interval_s: float = float(DEFAULT_STAT_INTERVAL_S)
    step_model: StepModel = DEFAULT_STEP_MODEL
    max_evictions_per_request: int = 1
    max_resident_headroom: int | None = None  # the ceiling a tuner may raise H to
    kv_blocks: int | None = field(
        default=None,
        metadata={
            DESCRIPTION: "KV-cache blocks per GEN worker; each request reserves its prompt +"
            " output tokens in blocks at admission (none: no memory limit, only B and H bound"
            " the residents)"
        },
    )
    kv_block_size: int = field(
        default=DEFAULT_KV_BLOCK_SIZE, metadata={DESCRIPTION: "tokens per KV-cache block"}
    )
    colocated: bool = field(
        default=False,
        metadata={
            DESCRIPTION: "GEN workers prefill their own prompts (no context stage), as a"
            " worker without --role does; the prefill is charged in the pass that admits"
        },
    )
    prefix_caching: bool = field(
        default=False,
        metadata={
            DESCRIPTION: "prefix caching in the GEN workers (the core's, needs colocated and a"
            " KV budget): admissions share the cached blocks their prompt starts with"
        },
    )
    num_speculative_tokens: int = field(
        default=0,
        metadata={
            DESCRIPTION: "speculative decoding: drafts each decoding request verifies per step"
            " (its plan's limit: at most this, and what its max_tokens leaves); 0: off"
        },
    )
    acceptance_rate: float = field(
        default=0.0,
        metadata={
            DESCRIPTION: "speculative decoding: the probability a draft is accepted, given the"
            " drafts before it were (each step a request emits 1 + its accepted drafts)"
        },
    )
    router: str = field(
        default="least-loaded",
        metadata={
            DESCRIPTION: "where a request goes: least-loaded (residents + waiters) or"
            " prefix-aware (the longest cached prefix of its prompt among the workers at most"
            " B/4 requests busier than the least loaded)"
        },
    )

    def __post_init__(self) -> None:
        if self.num_speculative_tokens < 0:
            raise ValueError(
                f"num_speculative_tokens must be >= 0, got {self.num_speculative_tokens}"
            )
        if not 0.0 <= self.acceptance_rate <= 1.0:
            raise ValueError(f"acceptance_rate must be in [0, 1], got {self.acceptance_rate}")

    @property
    def kv_budget(self) -> KVBudget | None:
        return None if self.kv_blocks is None else KVBudget(self.kv_blocks, self.kv_block_size)

    @property
    def kind(self) -> SimMode:
        """``mode``, parsed once (``ValueError`` naming the choices if unknown)."""
        try:
            return SimMode(self.mode)
        except ValueError:
            raise ValueError(
                f"unknown mode {self.mode!r}; choose from {', '.join(MODES)}"
            ) from None

    def settings(self) -> dict[str, object]:
        kind = self.kind
        if kind is SimMode.TARGET_OUTPUT_TPS:
            knobs: dict[str, object] = {"target_output_tps": self.target_output_tps}
        elif kind is SimMode.TPOT_BUDGET:
            knobs = {"tpot_budget": self.tpot_budget}
        else:
            return {}
        cap = default_paused_cap(self.max_batch, self.paused_cap_fraction)
        knobs |= {"paused_cap": cap, "resident_headroom": cap}
        if self.max_resident_headroom is not None:
            knobs["max_resident_headroom"] = max(self.max_resident_headroom, cap)
        return knobs
