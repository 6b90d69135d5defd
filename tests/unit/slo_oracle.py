"""The SLO policy's victim ranking (docs/design.md#preemption), brute-forced from scratch.

One oracle for the target_output_tps policy's `choose_victims`: every batch member is
measured, classified (laxity, below target, sacrificed) and ranked in one pass with none
of the policy's caches, heaps or remembered hysteresis. What it measures a request with
(its decode span D_i, its laxity L_i, whether it is in hysteresis) comes from a `Measure`:

- `Formulas`: the formulas of docs/design.md, written out independently of the policy
  (tests/unit/core/test_per_request_slo.py: the ranking, compared to a tolerance);
- the policy itself, whose `decode_span`, `laxity` and `is_in_hysteresis` have these names
  (tests/unit/core/test_policy_slo.py: its inlined scan against its own methods, exactly).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from hypothesis import strategies as st

from genpool_core.preemption import GenCapacity, TargetOutputTpsPolicy, create_gen_preemption
from genpool_core.request import GenRequest, VictimKind
from tests.unit.support import make_active

# docs/design.md's constants, spelled here rather than read from the policy.
MIN_LAXITY_FRACTION = 0.02  # a laxity victim has L_i >= this * D_i
MAX_LAXITY_PAUSES = 8
MAX_BELOW_TARGET_PAUSES = 3
RESUME_LAXITY_FRACTION = 0.01  # a laxity victim resumes this * D_i before its slack is gone
MAX_LAXITY_PAUSE_FRACTION = 0.35  # ... and at most this * D_i after now
WINDOW_FRACTION = 0.15  # below-target and sacrificed victims resume after this * D_i
HYSTERESIS_TOKENS = 4  # a request that just (re)started runs this many tokens ...
HYSTERESIS_FRACTION = 0.02  # ... and this * D_i before it can be paused again
RATE_PRIOR_TOKENS = 4  # its own rate once it decoded this many tokens here, else the prior


class Measure(Protocol):
    def decode_span(self, request: GenRequest) -> float: ...
    def laxity(self, request: GenRequest, now: float) -> float: ...
    def is_in_hysteresis(self, request: GenRequest, now: float) -> bool: ...


@dataclass(frozen=True)
class Formulas:
    """D_i, L_i and hysteresis from docs/design.md, independently of the policy's code.

    ``pool_floor`` is the pool's T (for a request without its own T_i); ``step_time`` the
    policy's step-time estimate, the rate prior of a request with too few tokens."""

    pool_floor: float
    step_time: float | None

    def floor(self, request: GenRequest) -> float:
        own = request.target_output_tps
        return own if own is not None else self.pool_floor

    def decode_span(self, request: GenRequest) -> float:
        return (request.max_tokens - 1) / self.floor(request)

    def laxity(self, request: GenRequest, now: float) -> float:
        generated = request.num_output_tokens - request.tokens_at_admission
        unpaused = request.unpaused_time(now)
        if generated >= RATE_PRIOR_TOKENS and unpaused > 0.0:
            rate = generated / unpaused
        else:
            rate = 1.0 / self.step_time if self.step_time is not None else self.floor(request)
        finish_at = now + (request.max_tokens - request.num_output_tokens) / rate
        return request.output_start_time() + self.decode_span(request) - finish_at

    def is_in_hysteresis(self, request: GenRequest, now: float) -> bool:
        run_s = now - (request.run_started_at or 0.0)
        run_tokens = request.num_output_tokens - request.tokens_at_run_start
        return run_tokens < HYSTERESIS_TOKENS or run_s < HYSTERESIS_FRACTION * (
            self.decode_span(request)
        )


class Ranked(NamedTuple):
    """One victim as `Victim` gives it (a plain tuple compares equal to it)."""

    request_id: str
    kind: VictimKind
    resume_due: float
    laxity: float | None  # None for below-target and sacrificed victims


def rank_victims(
    measure: Measure, batch: Iterable[GenRequest], now: float, credit: float
) -> list[Ranked]:
    """Every victim, in the order the policy should pause them all at ``now`` with
    ``credit`` in the bucket (each sacrifice spends 1): laxity victims by laxity, largest
    first (ties: batch order), then below-target, then sacrificed ones, oldest resident
    first, each request at most once."""
    laxity: list[tuple[float, int, GenRequest, float]] = []
    below: list[tuple[GenRequest, float]] = []
    sacrifices: list[tuple[GenRequest, float]] = []
    for order, request in enumerate(batch):
        span = measure.decode_span(request)
        if span <= 0.0 or measure.is_in_hysteresis(request, now):
            continue
        lax = measure.laxity(request, now)
        if lax >= MIN_LAXITY_FRACTION * span and request.num_pauses < MAX_LAXITY_PAUSES:
            laxity.append((lax, order, request, span))
        if (lax < 0.0 or request.is_sacrificed) and request.num_pauses < MAX_BELOW_TARGET_PAUSES:
            below.append((request, span))
        if not request.is_sacrificed:
            sacrifices.append((request, span))
    ranked: list[Ranked] = []
    for lax, _, request, span in sorted(laxity, key=lambda e: (-e[0], e[1])):
        hold = min(lax - RESUME_LAXITY_FRACTION * span, MAX_LAXITY_PAUSE_FRACTION * span)
        ranked.append(Ranked(request.request_id, VictimKind.LAXITY, now + hold, lax))
    chosen = {entry.request_id for entry in ranked}
    for kind, group in ((VictimKind.BELOW_TARGET, below), (VictimKind.SACRIFICED, sacrifices)):
        for request, span in sorted(group, key=lambda e: e[0].resident_since or 0.0):
            if request.request_id in chosen or (kind is VictimKind.SACRIFICED and credit < 1.0):
                continue
            chosen.add(request.request_id)
            credit -= kind is VictimKind.SACRIFICED
            ranked.append(Ranked(request.request_id, kind, now + WINDOW_FRACTION * span, None))
    return ranked


_STATE_PARTS = (
    st.integers(2, 400),  # max_tokens
    st.integers(0, 300),  # tokens decoded here
    st.sampled_from([0.0, 0.4, 3.0, 17.0]),  # unpaused time
    st.sampled_from([0.0, 2.0, 9.0]),  # first token this long before now
    st.integers(0, 9),  # pauses
    st.booleans(),  # sacrificed
    st.sampled_from([0.0, 0.3, 5.0]),  # run started this long before now
)
# A resident's state for enter_batch; with_floor adds T_i (None: the pool's T).
batch_state = st.tuples(*_STATE_PARTS)
batch_state_with_floor = st.tuples(*_STATE_PARTS, st.sampled_from([None, None, 2.0, 50.0, 400.0]))

# (max_tokens, decoded, unpaused s, first token s ago, pauses, sacrificed, run s[, T_i])
BatchState = (
    tuple[int, int, float, float, int, bool, float]
    | tuple[int, int, float, float, int, bool, float, float | None]
)


def enter_batch(policy: Any, states: Sequence[BatchState], now: float) -> list[GenRequest]:
    """Residents built from ``states``, entered into ``policy``'s batch in order: the
    scenarios both SLO ranking tests hand the oracle and the policy."""
    batch = []
    for number, state in enumerate(states):
        max_tokens, decoded, unpaused, ago, pauses, sacrificed, ran = state[:7]
        request = make_active(f"r{number}", max_tokens=max_tokens,
                              gen_tokens=min(decoded, max_tokens - 2), now=now,
                              unpaused=unpaused, first_token_time=now - ago,
                              resident_since=now - ago - 1.0)  # fmt: skip
        request.num_pauses, request.is_sacrificed = pauses, sacrificed
        request.run_started_at = now - ran
        if len(state) > 7:
            request.target_output_tps = state[7]
        batch.append(request)
        policy.on_batch_enter(request)
    return batch


T = 10.0  # the pool's floor in the SLO ranking tests, tok/s


def slo_policy(cap: int = 4) -> TargetOutputTpsPolicy:
    """An SLO-mode policy at ``T`` on a batch of 8, P = H = ``cap``."""
    policy = create_gen_preemption(
        {"target_output_tps": T, "paused_cap": cap, "resident_headroom": cap}, GenCapacity(8)
    )
    assert isinstance(policy, TargetOutputTpsPolicy)
    return policy


def ranking_scenario(
    states: Sequence[BatchState], credit: float, step_time: float | None, now: float = 50.0
) -> tuple[TargetOutputTpsPolicy, list[GenRequest]]:
    """A policy with this credit and step time, and ``states`` entered into its batch."""
    policy = slo_policy()
    policy.credit = credit
    if step_time is not None:
        policy.on_step_time(step_time)
    return policy, enter_batch(policy, states, now)
