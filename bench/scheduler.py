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

KV blocks. Each mode runs twice: without a KV budget, then (the three modes side by side
again, right after) with one H200's KV at the Llama-3.1-8B shape (``KV_BUDGET``, 51498
blocks of 16 tokens: each admission reserves its prompt + output in blocks, each finish
gives them back). The budget holds the residents at their longest (256 x 144 blocks), so
memory never binds and both runs make the same decisions (checked: ``same_decisions``);
the difference is the blocks' bookkeeping.

Prefix caching. Then each mode twice more, side by side: prompts this worker prefills
(``num_output_tokens`` 0, block hashes, half of them starting with the same 1024-token
system prompt), with the KV budget, without (``+prefill``) and with (``+cache``) the
prefix cache: the cost of looking up, sharing and registering blocks. The runner:
``bench/scheduler_runner.py``; summaries, targets and the table:
``bench/scheduler_report.py``.
"""

from __future__ import annotations

import gc
import os
import platform
import sys
from typing import Any

from bench.scheduler_report import (
    TARGET_SCALE,
    cache_side_by_side,
    format_table,
    kv_side_by_side,
    kv_target,
    targets,
)
from bench.scheduler_runner import (
    KV_BUDGET,
    MAX_TOKENS,
    MODES,
    SEED,
    STEP_DT,
    Passes,
    Runner,
    Scale,
)

__all__ = ["format_table", "run"]  # bench.run's interface
SCALES = (Scale(256, 1024), Scale(32, 64))
FULL = Passes(warmup=4000, measured=8000)
QUICK = Passes(warmup=300, measured=300)


def bench_scale(scale: Scale, passes: Passes) -> dict[str, dict[str, Any]]:
    """Every mode at one scale, side by side, without KV blocks and then with them."""
    results = _side_by_side([Runner(scale, mode) for mode in MODES], passes)
    results |= _side_by_side([Runner(scale, mode, kv=True) for mode in MODES], passes)
    prefills = [Runner(scale, mode, prefill=True) for mode in MODES]
    caches = [Runner(scale, mode, cache=True) for mode in MODES]
    return results | _side_by_side(prefills + caches, passes)


def _side_by_side(runners: list[Runner], passes: Passes) -> dict[str, dict[str, Any]]:
    """The measured passes interleave the runners (one pass each, in rotating order), so
    the machine's load at any moment weighs on all of them alike and their ratios are
    comparable. The KV runners are a group of their own, run after: interleaved with the
    plain ones, today's slow block release (``BlockPool.free``) polluted their caches and
    raised the plain passes' medians by ~45 % (256/1024, same day)."""
    for runner in runners:
        for _ in range(passes.warmup):
            runner.one_pass()
        runner.start_measuring()
    gc.collect()
    for number in range(passes.measured):
        shift = number % len(runners)
        for runner in runners[shift:] + runners[:shift]:
            runner.measured_pass()
    return {runner.name: runner.result(passes) for runner in runners}


def bench_one(scale: Scale, mode: str, passes: Passes) -> dict[str, Any]:
    """One mode alone (profiling)."""
    runner = Runner(scale, mode)
    for _ in range(passes.warmup):
        runner.one_pass()
    runner.start_measuring()
    for _ in range(passes.measured):
        runner.measured_pass()
    return runner.result(passes)


def run(*, quick: bool = False) -> dict[str, Any]:
    passes = QUICK if quick else FULL
    configs: dict[str, dict[str, Any]] = {}
    for scale in SCALES:
        configs[scale.name] = bench_scale(scale, passes)
        print(f"  {scale.name:>9} done", file=sys.stderr, flush=True)
    kv = kv_side_by_side(configs)
    cache = cache_side_by_side(configs)
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
            "kv_budget": {"num_blocks": KV_BUDGET.num_blocks, "block_size": KV_BUDGET.block_size},
        },
        "target": targets(configs[TARGET_SCALE]),
        "kv": kv,
        "kv_target": kv_target(kv),
        "prefix_cache": cache,
        "configs": configs,
    }


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
