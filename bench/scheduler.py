"""Cost of one scheduling pass, ``GenScheduler.step(now)``, and of its ``postprocess``.

Steady state, per mode (off, tpot_budget, target_output_tps) and per scale
(residents / waiters): 256/1024 (the docs/design.md#testing-and-benchmarks target point) and 32/64.

Workload (seeded, deterministic): a synthetic pass clock advances ``STEP_DT`` per
pass (the model's step time); every batch request gets one token per pass and
finishes when it reaches its ``max_tokens`` (uniform in ``MAX_TOKENS``), so there
is churn every pass. Before each pass the queue is topped up to the scale's
waiter count with keyed arrivals (``arrival_time = first_token_time = now``), so
the queue stays ~full and its head ages to about X: waiters become at risk and
the two preemption modes pause and resume all the time.

Capacity. With preemption on, residents = active + paused <= B + H, so the
residents point is reached with ``B = 3/4 R`` and ``H = P = R/4`` (256 -> B=192,
H=P=64; 32 -> B=24, H=P=8). With preemption off nothing is ever paused, so
residents == active <= B and the off runs use ``B = R``, ``H = P = 0``. Observed
mean residents/active/paused are reported next to each timing.

Timing: ``time.perf_counter_ns`` around ``step`` and around ``postprocess``,
separately; queue top-up (``add_request``) is outside both. At each scale the three
modes are measured side by side: after their warm-ups, the measured passes interleave
the modes one pass each (rotating which goes first), so a noisy, shared machine loads
them alike and a preemption mode's ratio to ``off`` is meaningful. The garbage collector
stays on (as in the worker); stat lines are emitted on the pass clock as usual
(every 30 s = 1000 passes), so they are part of the distribution.
"""

from __future__ import annotations

import gc
import math
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from genpool_core.plan import GenPlan
from genpool_core.preemption import GenCapacity
from genpool_core.request import GenRequest
from genpool_core.scheduler import GenScheduler, SchedulerConfig

STEP_DT = 0.03  # seconds of pass clock per pass (one decode step)
MAX_TOKENS = (8, 256)  # uniform output lengths; mean ~132 tokens
TARGET_MEDIAN_STEP_US = 100.0  # targets at 256 residents / 1024 waiters, every mode
TARGET_P99_STEP_US = 300.0
TARGET_RATIO_TO_OFF = 2.0  # a preemption mode's median pass vs off's, in the same run
TARGET_SCALE = "256/1024"
SEED = 20240501

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


SCALES = (Scale(256, 1024), Scale(32, 64))


@dataclass(frozen=True)
class Passes:
    warmup: int
    measured: int


FULL = Passes(warmup=4000, measured=8000)
QUICK = Passes(warmup=300, measured=300)


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


def _summary_us(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)
    n = len(ordered)

    def rank(q: float) -> float:  # nearest-rank percentile
        return ordered[max(0, math.ceil(q * n) - 1)] / 1000.0

    return {
        "median": round(statistics.median(ordered) / 1000.0, 2),
        "p90": round(rank(0.90), 2),
        "p99": round(rank(0.99), 2),
        "mean": round(statistics.fmean(ordered) / 1000.0, 2),
        "min": round(ordered[0] / 1000.0, 2),
        "max": round(ordered[-1] / 1000.0, 2),
    }


class Workload:
    """Keeps the queue topped up with keyed arrivals of seeded random length."""

    def __init__(self, scheduler: GenScheduler, waiters: int, seed: int) -> None:
        self.scheduler = scheduler
        self.waiters = waiters
        self.rnd = random.Random(seed)
        self.serial = 0

    def top_up(self, now: float) -> int:
        added = 0
        while self.scheduler.num_waiting < self.waiters:
            self.serial += 1
            request = GenRequest(
                f"req-{self.serial}",
                prompt_len=self.rnd.randint(16, 2048),
                max_tokens=self.rnd.randint(*MAX_TOKENS),
                arrival_time=now,
                first_token_time=now,
            )
            self.scheduler.add_request(request, now)
            added += 1
        return added


class Runner:
    """One scheduler (one mode at one scale) and its workload, pass by pass."""

    def __init__(self, scale: Scale, mode: str) -> None:
        capacity, capacity_settings = capacity_for(scale, mode)
        self.scale, self.mode = scale, mode
        self.settings = {**MODES[mode], **capacity_settings}
        self.scheduler = GenScheduler.from_settings(
            self.settings,
            capacity,
            SchedulerConfig(max_queue_length=max(scale.waiters, 1)),
        )
        self.workload = Workload(self.scheduler, scale.waiters, SEED)
        self.now = 0.0
        self.step_ns: list[int] = []
        self.post_ns: list[int] = []
        self.totals = {"admitted": 0, "finished": 0, "paused": 0, "resumed": 0, "stat_lines": 0}
        self.gauges: dict[str, list[int]] = {
            name: [] for name in ("residents", "active", "paused", "waiters", "at_risk")
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
        return t1 - t0, t3 - t2, plan

    def start_measuring(self) -> None:
        if not self.scheduler.queue.target.is_initialised:
            raise RuntimeError(f"{self.mode} {self.scale.name}: admission target not initialised")
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
            raise AssertionError(f"{self.mode} {self.scale.name}: capacity broken at {self.now}")

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
            "scale": {"residents": self.scale.residents, "waiters": self.scale.waiters},
            "settings": self.settings,
            "capacity": {
                "max_batch_size": scheduler.max_batch_size,
                "resident_headroom": scheduler.knobs.resident_headroom,
                "paused_cap": scheduler.knobs.paused_cap,
            },
            "passes": {"warmup": passes.warmup, "measured": passes.measured},
            "step_us": _summary_us(self.step_ns),
            "postprocess_us": _summary_us(self.post_ns),
            "step_plus_postprocess_us": _summary_us(total_ns),
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


def bench_scale(scale: Scale, passes: Passes) -> dict[str, dict[str, Any]]:
    """Every mode at one scale, measured side by side: the measured passes interleave
    the modes (one pass each, in rotating order), so the machine's load at any moment
    weighs on all of them alike and their ratios are comparable."""
    runners = [Runner(scale, mode) for mode in MODES]
    for runner in runners:
        for _ in range(passes.warmup):
            runner.one_pass()
        runner.start_measuring()
    gc.collect()
    for number in range(passes.measured):
        shift = number % len(runners)
        for runner in runners[shift:] + runners[:shift]:
            runner.measured_pass()
    return {runner.mode: runner.result(passes) for runner in runners}


def bench_one(scale: Scale, mode: str, passes: Passes) -> dict[str, Any]:
    """One mode alone (profiling)."""
    runner = Runner(scale, mode)
    for _ in range(passes.warmup):
        runner.one_pass()
    runner.start_measuring()
    for _ in range(passes.measured):
        runner.measured_pass()
    return runner.result(passes)


def _targets(at_target: dict[str, dict[str, Any]]) -> dict[str, Any]:
    medians = {mode: r["step_us"]["median"] for mode, r in at_target.items()}
    p99s = {mode: r["step_us"]["p99"] for mode, r in at_target.items()}
    off = medians["off"]
    ratios = {mode: round(m / off, 2) for mode, m in medians.items() if mode != "off"}
    return {
        "scale": TARGET_SCALE,
        "medians_us": medians,
        "p99s_us": p99s,
        "ratios_to_off": ratios,
        "limits": {
            "median_us": TARGET_MEDIAN_STEP_US,
            "p99_us": TARGET_P99_STEP_US,
            "ratio_to_off": TARGET_RATIO_TO_OFF,
        },
        "met": {
            mode: {
                "median": medians[mode] < TARGET_MEDIAN_STEP_US,
                "p99": p99s[mode] < TARGET_P99_STEP_US,
                **({"ratio": ratios[mode] <= TARGET_RATIO_TO_OFF} if mode in ratios else {}),
            }
            for mode in medians
        },
    }


def run(*, quick: bool = False) -> dict[str, Any]:
    passes = QUICK if quick else FULL
    configs: dict[str, dict[str, Any]] = {}
    for scale in SCALES:
        configs[scale.name] = bench_scale(scale, passes)
        print(f"  {scale.name:>9} done", file=sys.stderr, flush=True)
    return {
        "benchmark": "scheduler",
        "description": "GenScheduler.step(now) and postprocess cost in steady state, microseconds",
        "quick": quick,
        "environment": {
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        "workload": {
            "step_dt_s": STEP_DT,
            "max_tokens_uniform": list(MAX_TOKENS),
            "arrivals": "queue topped up to the waiter count before every pass",
            "seed": SEED,
            "measurement": "modes interleaved pass by pass at each scale (side by side)",
        },
        "target": _targets(configs[TARGET_SCALE]),
        "configs": configs,
    }


def format_table(result: dict[str, Any]) -> str:
    env = result["environment"]
    lines = [
        f"Python {env['python']} ({env['implementation']}), {env['cpu_count']} CPUs"
        + ("  [QUICK run: numbers not meaningful]" if result.get("quick") else ""),
        f"{'scale':>9} {'mode':<18} {'step med':>9} {'p99':>8} {'mean':>8} "
        f"{'post med':>9} {'p99':>8} {'res':>6} {'act':>6} {'paused':>6} "
        f"{'pauses':>7} {'resumes':>7}",
    ]
    for scale_name, modes in result["configs"].items():
        for mode, r in modes.items():
            s, q, o, a = r["step_us"], r["postprocess_us"], r["observed_mean"], r["activity"]
            lines.append(
                f"{scale_name:>9} {mode:<18} {s['median']:>9.1f} {s['p99']:>8.1f} "
                f"{s['mean']:>8.1f} {q['median']:>9.1f} {q['p99']:>8.1f} "
                f"{o['residents']:>6.1f} {o['active']:>6.1f} {o['paused']:>6.1f} "
                f"{a['paused']:>7} {a['resumed']:>7}"
            )
    target = result["target"]
    verdict = ", ".join(
        f"{mode} {target['medians_us'][mode]:.1f} / p99 {target['p99s_us'][mode]:.1f}"
        + (
            f" / {target['ratios_to_off'][mode]:.2f}x off"
            if mode in target["ratios_to_off"]
            else ""
        )
        + (" (met)" if all(met.values()) else " (NOT met)")
        for mode, met in target["met"].items()
    )
    limits = target["limits"]
    lines.append(
        f"target at {target['scale']}: median < {limits['median_us']:.0f} us, "
        f"p99 < {limits['p99_us']:.0f} us, <= {limits['ratio_to_off']:.0f}x off: {verdict}"
    )
    lines.append("(times in microseconds; res/act/paused: mean over measured passes)")
    return "\n".join(lines)


def _profile(argv: list[str] | None = None) -> None:
    """``python -m bench.scheduler --profile MODE [--scale R/W]``: cProfile hot spots."""
    import argparse
    import cProfile
    import pstats

    parser = argparse.ArgumentParser(prog="python -m bench.scheduler")
    parser.add_argument("--profile", required=True, choices=list(MODES), metavar="MODE")
    parser.add_argument("--scale", default=TARGET_SCALE, choices=[s.name for s in SCALES])
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    scale = next(s for s in SCALES if s.name == args.scale)
    profiler = cProfile.Profile()
    profiler.enable()
    bench_one(scale, args.profile, FULL)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    _profile()
