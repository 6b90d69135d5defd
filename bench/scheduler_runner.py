"""One scheduler and its synthetic workload, pass by pass: ``bench/scheduler.py``'s
runner (its docstring describes the workload, the capacity and the timing).
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

from bench.scheduler_report import CACHE_SUFFIX, KV_SUFFIX, PREFILL_SUFFIX, summary_us
from genpool_core.names import DEFAULT_KV_BLOCK_SIZE
from genpool_core.plan import GenPlan
from genpool_core.preemption import GenCapacity
from genpool_core.request import GenRequest
from genpool_core.scheduler import GenScheduler, SchedulerConfig
from genpool_sim.kv_memory import H200_LLAMA_8B_KV_BYTES, LLAMA_31_8B_BF16

STEP_DT = 0.03  # seconds of pass clock per pass (one decode step)
MAX_TOKENS = (8, 256)  # uniform output lengths; mean ~132 tokens
SEED = 20240501
KV_BUDGET = LLAMA_31_8B_BF16.budget_for(H200_LLAMA_8B_KV_BYTES, DEFAULT_KV_BLOCK_SIZE)

# target_output_tps: at one token per STEP_DT a request decodes at ~33 tok/s. With
# 1024 keyed waiters and B=192 the queue wait is ~20 s, so T=20 tok/s would put every
# request below target at admission (only below_target victims). T=8 leaves the
# longer requests with positive laxity, so laxity, below_target and sacrifice victims
# all occur and every branch of choose_victim is exercised.
MODES: dict[str, dict[str, object]] = {
    "off": {},
    "tpot_budget": {"tpot_budget": 0.1},
    "target_output_tps": {"target_output_tps": 8.0},
}


@dataclass(frozen=True)
class Scale:
    residents: int
    waiters: int

    @property
    def name(self) -> str:
        return f"{self.residents}/{self.waiters}"


@dataclass(frozen=True)
class Passes:
    warmup: int
    measured: int


def capacity_for(scale: Scale, mode: str) -> tuple[GenCapacity, dict[str, object]]:
    """Engine shape and capacity settings that put ``scale.residents`` residents in play."""
    if mode == "off":
        return GenCapacity(max_batch_size=scale.residents), {}
    headroom = scale.residents // 4
    batch = scale.residents - headroom
    return (
        GenCapacity(max_batch_size=batch),
        {"resident_headroom": headroom, "paused_cap": headroom},
    )


SHARED_PREFIX_BLOCKS = 64  # the prefix-cache runs: half the prompts start with 1024 shared tokens
TOP_BIT = 1 << 63


def prompt_hashes(serial: int, prompt_len: int, block_size: int) -> list[int]:
    """Block hashes of a prompt (the prefix-cache runs): even serials start with the shared
    system prompt's chain, the rest of every prompt is its own."""
    num_blocks = prompt_len // block_size
    shared = min(num_blocks, SHARED_PREFIX_BLOCKS) if serial % 2 == 0 else 0
    own = [TOP_BIT | serial << 16 | i for i in range(shared, num_blocks)]
    return [TOP_BIT | i for i in range(shared)] + own


class Workload:
    """Keeps the queue topped up with keyed arrivals of seeded random length (with block
    hashes when ``is_hashing``: a prefix-cache run)."""

    def __init__(self, scheduler: GenScheduler, waiters: int, seed: int,
                 is_hashing: bool = False) -> None:  # fmt: skip
        self.scheduler = scheduler
        self.waiters = waiters
        self.rnd = random.Random(seed)
        self.serial = 0
        self.is_hashing = is_hashing

    def top_up(self, now: float) -> int:
        added = 0
        while self.scheduler.num_waiting < self.waiters:
            self.serial += 1
            prompt_len = self.rnd.randint(16, 2048)
            request = GenRequest(
                f"req-{self.serial}",
                prompt_len=prompt_len,
                max_tokens=self.rnd.randint(*MAX_TOKENS),
                arrival_time=now,
                first_token_time=now,
            )
            if self.is_hashing:  # a prompt this worker prefills: no first token yet
                request.num_output_tokens = 0
                request.first_token_time = None
                request.block_hashes = prompt_hashes(self.serial, prompt_len,
                                                     DEFAULT_KV_BLOCK_SIZE)  # fmt: skip
            self.scheduler.add_request(request, now)
            added += 1
        return added


class Runner:
    """One scheduler (one mode at one scale, with or without KV blocks) and its workload,
    pass by pass."""

    def __init__(self, scale: Scale, mode: str, *, kv: bool = False, prefill: bool = False,
                 cache: bool = False) -> None:  # fmt: skip
        """``prefill``: the worker prefills its prompts (they carry block hashes, with KV
        blocks); ``cache``: and shares them through the prefix cache."""
        capacity, capacity_settings = capacity_for(scale, mode)
        self.scale, self.mode = scale, mode
        suffix = CACHE_SUFFIX if cache else PREFILL_SUFFIX if prefill else KV_SUFFIX if kv else ""
        self.name = mode + suffix
        prefill = prefill or cache
        self.settings = {**MODES[mode], **capacity_settings}
        self.scheduler = GenScheduler.from_settings(
            self.settings,
            capacity,
            SchedulerConfig(
                max_queue_length=max(scale.waiters, 1),
                kv_budget=KV_BUDGET if kv or prefill else None,
                enable_prefix_caching=cache,
            ),
        )
        self.workload = Workload(self.scheduler, scale.waiters, SEED, is_hashing=prefill)
        self.now = 0.0
        self.step_ns: list[int] = []
        self.post_ns: list[int] = []
        self.totals = {"admitted": 0, "finished": 0, "paused": 0, "resumed": 0, "stat_lines": 0}
        self.gauges: dict[str, list[int]] = {
            name: []
            for name in ("residents", "active", "paused", "waiters", "at_risk", "kv_blocks_used")
        }
        self._victims_before: dict[str, int] = {}
        self._forced_before = 0

    def one_pass(self) -> tuple[int, int, GenPlan]:
        scheduler = self.scheduler
        self.workload.top_up(self.now)
        t0 = time.perf_counter_ns()
        plan = scheduler.step(self.now)
        t1 = time.perf_counter_ns()
        self.now += STEP_DT
        t2 = time.perf_counter_ns()
        scheduler.postprocess(plan, self.now)
        t3 = time.perf_counter_ns()
        scheduler.kv.take_events()  # as the engine does every pass (else they pile up)
        return t1 - t0, t3 - t2, plan

    def start_measuring(self) -> None:
        if not self.scheduler.queue.target.is_initialised:
            raise RuntimeError(f"{self.name} {self.scale.name}: admission target not initialised")
        counters = self.scheduler.pausing.counters
        self._victims_before = dict(counters.victims)
        self._forced_before = counters.forced_resumes

    def measured_pass(self) -> None:
        scheduler, gauges = self.scheduler, self.gauges
        # Gauges as the pass sees them (before it runs), taken outside the timing.
        gauges["residents"].append(scheduler.num_residents)
        gauges["waiters"].append(scheduler.num_waiting)
        step_time, post_time, plan = self.one_pass()
        self.step_ns.append(step_time)
        self.post_ns.append(post_time)
        gauges["active"].append(len(plan.batch_ids))
        gauges["paused"].append(len(plan.paused_in_place_ids))
        gauges["at_risk"].append(scheduler.queue.num_at_risk(plan.now))
        gauges["kv_blocks_used"].append(scheduler.kv.num_used)
        self.totals["admitted"] += len(plan.admitted_ids)
        self.totals["finished"] += len(plan.finished_ids)
        self.totals["paused"] += len(plan.paused_ids)
        self.totals["resumed"] += len(plan.resumed_ids)
        self.totals["stat_lines"] += plan.stat_line is not None
        # The capacity invariants hold on every pass (a benchmark of a broken
        # scheduler is worthless).
        b, knobs = scheduler.max_batch_size, scheduler.knobs
        if not (
            len(plan.batch_ids) <= b
            and scheduler.num_residents <= b + knobs.resident_headroom
            and scheduler.num_paused <= knobs.paused_cap <= knobs.resident_headroom
        ):
            raise AssertionError(f"{self.name} {self.scale.name}: capacity broken at {self.now}")

    def result(self, passes: Passes) -> dict[str, Any]:
        scheduler = self.scheduler
        counters = scheduler.pausing.counters
        before = self._victims_before
        victims = {
            kind: count - before.get(kind, 0)
            for kind, count in counters.victims.items()
            if count - before.get(kind, 0)
        }
        total_ns = [s + q for s, q in zip(self.step_ns, self.post_ns, strict=True)]
        return {
            "mode": self.mode,
            "kv_blocks": self.scheduler.kv.num_blocks,  # 0: no KV budget
            "scale": {"residents": self.scale.residents, "waiters": self.scale.waiters},
            "settings": self.settings,
            "capacity": {
                "max_batch_size": scheduler.max_batch_size,
                "resident_headroom": scheduler.knobs.resident_headroom,
                "paused_cap": scheduler.knobs.paused_cap,
            },
            "passes": {"warmup": passes.warmup, "measured": passes.measured},
            "step_us": summary_us(self.step_ns),
            "postprocess_us": summary_us(self.post_ns),
            "step_plus_postprocess_us": summary_us(total_ns),
            "observed_mean": {
                name: round(statistics.fmean(values), 1) for name, values in self.gauges.items()
            },
            "activity": {
                **self.totals,
                "victims": victims,
                "forced_resumes": counters.forced_resumes - self._forced_before,
                "admission_target_s": round(scheduler.queue.target.value or 0.0, 3),
            },
        }
