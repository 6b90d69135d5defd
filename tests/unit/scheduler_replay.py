"""A 250-client simulation whose every scheduling pass is fingerprinted.

The reference (``tests/data/scheduler_replay.json``) was recorded from the scheduler
before the policy refactor and the incremental victim search; the replay test
(``test_scheduler_replay.py``) demands the same decision in every pass. Record a new
reference only for an intended behaviour change:
``.venv/bin/python -m tests.unit.scheduler_replay --record``.

A pass's fingerprint covers its decisions (time, batch, paused in place, admitted,
resumed, paused, finished, with slots), not ``repr(GenPlan)``: plan fields added for
consumers and stat-line fields added for reporting do not change a decision.
Live knob changes (as the operator's tuner makes them) are applied on a fixed pass
schedule, so ``set_knobs`` is replayed too.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from genpool_core.knobs import Knobs
from genpool_core.plan import GenPlan
from genpool_core.preemption import GenCapacity
from genpool_core.request import GenRequest
from genpool_core.scheduler import GenScheduler, SchedulerConfig
from genpool_sim.cluster import ClusterConfig
from genpool_sim.experiment import Workload, simulate
from genpool_sim.workload import TraceRequest

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "scheduler_replay.json"
MODES = ("off", "recompute", "tpot_budget", "target_output_tps")
CLIENTS = 250
DURATION_S = 240.0
SEED = 11
SAMPLE_EVERY = 2000  # passes between stored per-pass digests (to locate a divergence)
KNOB_EVERY = 700  # passes of one worker between live knob changes
# (resident_headroom, paused_cap) cycled through on worker 0; within the ceiling of 6
# that max_batch 16 and the default paused-cap fraction give.
KNOB_CYCLE = ((6, 6), (6, 3), (2, 1), (5, 5), (4, 0), (6, 4))
# Prompt/output lengths with a long tail: short chats to 900-token answers.
LENGTHS = [TraceRequest(0.0, 200 + 97 * i % 1800, 8 + 61 * i % 900) for i in range(240)]


def config_for(mode: str) -> ClusterConfig:
    # T = 14 tok/s sits near the pool's median rate under this load, so laxity,
    # below-target and sacrifice victims all occur.
    return ClusterConfig(mode=mode, workers=4, max_batch=16, target_output_tps=14.0)


def decision_digest(plan: GenPlan) -> str:
    """Fingerprint of what one pass decided (robust to fields added to the plan)."""
    decision = (
        plan.now,
        plan.batch_ids,
        plan.batch_slots,
        plan.paused_in_place_ids,
        plan.paused_in_place_slots,
        plan.admitted_ids,
        plan.resumed_ids,
        plan.paused_ids,
        plan.finished_ids,
    )
    return hashlib.sha256(repr(decision).encode()).hexdigest()[:16]


@dataclass
class Trace:
    num_passes: int = 0
    num_paused: int = 0
    num_resumed: int = 0
    num_knob_changes: int = 0

    def __post_init__(self) -> None:
        self._chain = hashlib.sha256()
        self.samples: dict[str, str] = {}

    def add(self, plan: GenPlan) -> None:
        digest = decision_digest(plan)
        self._chain.update(digest.encode())
        if self.num_passes % SAMPLE_EVERY == 0:
            self.samples[str(self.num_passes)] = digest
        self.num_passes += 1
        self.num_paused += len(plan.paused_ids)
        self.num_resumed += len(plan.resumed_ids)

    def summary(self) -> dict[str, object]:
        return {
            "passes": self.num_passes,
            "paused": self.num_paused,
            "resumed": self.num_resumed,
            "knob_changes": self.num_knob_changes,
            "chain": self._chain.hexdigest(),
            "samples": self.samples,
        }


@contextmanager
def traced(trace: Trace, with_knobs: bool) -> Iterator[None]:
    """Fingerprint every pass; on the first scheduler, change knobs on a schedule."""
    original = GenScheduler.step
    passes: dict[int, int] = {}
    first: list[GenScheduler] = []

    def step(self: GenScheduler, now: float) -> GenPlan:
        if not first:
            first.append(self)
        count = passes.get(id(self), 0)
        passes[id(self)] = count + 1
        if with_knobs and self is first[0] and count and count % KNOB_EVERY == 0:
            headroom, cap = KNOB_CYCLE[(count // KNOB_EVERY) % len(KNOB_CYCLE)]
            self.set_knobs(Knobs(resident_headroom=headroom, paused_cap=cap))
            trace.num_knob_changes += 1
        plan = original(self, now)
        trace.add(plan)
        return plan

    GenScheduler.step = step  # type: ignore[method-assign]
    try:
        yield
    finally:
        GenScheduler.step = original  # type: ignore[method-assign]


def replay(mode: str) -> dict[str, object]:
    trace = Trace()
    workload = Workload(LENGTHS, concurrency=CLIENTS, duration_s=DURATION_S, warmup_s=10.0)
    with traced(trace, with_knobs=mode in ("tpot_budget", "target_output_tps")):
        simulate(config_for(mode), workload, SEED)
    return trace.summary()


@dataclass(frozen=True)
class Saturated:
    """A pool kept saturated: the queue topped up to ``waiters`` keyed arrivals before
    every pass, one token per batch request per ``STEP_DT`` (the benchmark's workload).
    Its queue heads age past the target, so every victim kind occurs (sacrifices too,
    which the simulated pool's closed loop does not reach)."""

    residents: int
    waiters: int
    passes: int

    STEP_DT = 0.03

    @property
    def name(self) -> str:
        return f"saturated_{self.residents}_{self.waiters}"


SATURATED = (Saturated(32, 64, 6000), Saturated(256, 1024, 2500))
SATURATED_SETTINGS: dict[str, dict[str, object]] = {
    "tpot_budget": {"tpot_budget": 0.1},
    "target_output_tps": {"target_output_tps": 14.0},
}


def replay_saturated(shape: Saturated, mode: str) -> dict[str, object]:
    headroom = shape.residents // 4
    scheduler = GenScheduler.from_settings(
        {**SATURATED_SETTINGS[mode], "resident_headroom": headroom, "paused_cap": headroom},
        GenCapacity(max_batch_size=shape.residents - headroom),
        SchedulerConfig(max_queue_length=shape.waiters),
    )
    rnd = random.Random(SEED)
    trace = Trace()
    now = 0.0
    for number in range(shape.passes):
        while scheduler.num_waiting < shape.waiters:
            arrival = GenRequest(
                f"r{number}-{scheduler.num_waiting}",
                prompt_len=rnd.randint(16, 2048),
                max_tokens=rnd.randint(8, 256),
                arrival_time=now,
                first_token_time=now,
            )
            scheduler.add_request(arrival, now)
        if number and number % KNOB_EVERY == 0:
            step = (number // KNOB_EVERY) % 4
            cap = headroom - step * headroom // 4
            scheduler.set_knobs(Knobs(headroom - step, min(cap, headroom - step)))
            trace.num_knob_changes += 1
        plan = scheduler.step(now)
        trace.add(plan)
        now += shape.STEP_DT
        scheduler.postprocess(plan, now)
    return trace.summary()


def replay_all() -> dict[str, dict[str, object]]:
    runs = {mode: replay(mode) for mode in MODES}
    for shape in SATURATED:
        for mode in SATURATED_SETTINGS:
            runs[f"{shape.name}_{mode}"] = replay_saturated(shape, mode)
    return runs


def main(argv: list[str]) -> int:
    if argv != ["--record"]:
        print(__doc__, file=sys.stderr)
        return 2
    reference = replay_all()
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    REFERENCE.write_text(json.dumps(reference, indent=1, sort_keys=True) + "\n")
    for mode, summary in reference.items():
        print(mode, {k: v for k, v in summary.items() if k != "samples"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
