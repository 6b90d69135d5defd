"""Faults under load (issue 33): a P/D GenPool on the local control plane, its traffic a
streaming load of ``openai`` SDK clients through the endpoint-picker gateway (GIE's own
``epp`` with tests/integration/epp_gateway.py in Envoy's place), and, at seeded random
moments, kill -9 of a GEN (decode) worker, of a prefill worker and of the operator, and
one restart of the kube-apiserver. Reports the requests sent, failed by cause, hangs and
silently truncated streams (goal: none of either), and for each fault how long until the
pool was whole again (its desired ready replicas, the decode pods told the prefill pods).

    python -m bench.run faults            # ~4 minutes of load, bench/results/faults.json
    python -m bench.run faults --quick    # the same faults in a shorter window

The operator runs as a local process (the chart's Deployment would restart it; here the
bench does, as soon as it is dead). Worker processes are found by their pod IP (each pod
has its own loopback address) and killed by PID; the pod runner restarts them as the
kubelet does.
"""

from __future__ import annotations

import os
import random
import signal
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.fault_load import StreamingLoad, summarise
from bench.fault_pool import FaultPool

SEED = 33
CLIENTS = 6
WINDOW_S = (180.0, 60.0)  # faults fall in this window after the warm-up (full, quick)
TAIL_S = (60.0, 30.0)  # load after the last recovery
WARMUP_S = 20.0
FAULTS = ("kill -9 GEN worker", "kill -9 prefill worker", "kill -9 operator",
          "restart kube-apiserver")  # fmt: skip
RECOVERY_TIMEOUT_S = 240.0


def schedule(window_s: float, seed: int) -> list[tuple[float, str]]:
    """Each fault at a seeded moment in the window, in time order, at least 20 s apart
    (one fault's recovery is measured before the next)."""
    rng = random.Random(seed)
    slots = sorted(rng.uniform(0, window_s) for _ in FAULTS)
    order = rng.sample(FAULTS, len(FAULTS))
    times, last = [], -20.0
    for moment in slots:
        last = max(moment, last + 20.0)
        times.append(last)
    return list(zip(times, order, strict=True))


def _inject(pool: FaultPool, fault: str) -> tuple[str, str | None]:
    """Do ``fault``: what was hit, and the pod that must restart (None: no pod)."""
    if fault in ("kill -9 GEN worker", "kill -9 prefill worker"):
        pid, pod = pool.worker_pid("decode" if "GEN" in fault else "prefill")
        os.kill(pid, signal.SIGKILL)
        return f"pod {pod}, pid {pid}", pod
    if fault == "kill -9 operator":
        pid = pool.operator.kill()
        pool.operator.start()  # as the Deployment's kubelet would
        return f"pid {pid}, started again", None
    pool.restart_apiserver()
    return "stopped (SIGTERM) and started again", None


def _faults(pool: FaultPool, plan: list[tuple[float, str]], start: float) -> list[dict[str, Any]]:
    """Each fault at its moment; how long until the pool was whole again."""
    events: list[dict[str, Any]] = []
    for at, fault in plan:
        time.sleep(max(0.0, start + WARMUP_S + at - time.monotonic()))
        before = pool.baseline()
        hit_at = time.monotonic()
        what, pod = _inject(pool, fault)
        recovered = pool.wait_recovered(before, RECOVERY_TIMEOUT_S, restarted=pod)
        events.append({"fault": fault, "at_s": round(hit_at - start, 2), "hit": what,
                       "recovered_s": None if recovered is None
                       else round(recovered - hit_at, 2)})  # fmt: skip
    return events


def run(*, quick: bool) -> dict[str, Any]:
    window_s, tail_s = WINDOW_S[quick], TAIL_S[quick]
    plan = schedule(window_s, SEED)
    with (
        tempfile.TemporaryDirectory(prefix="genpool-faults-") as tmp,
        FaultPool(Path(tmp)) as pool,
        ExitStack() as gateway,
    ):
        base_url = pool.start_gateway(gateway)
        with StreamingLoad(base_url, pool.model, CLIENTS) as load:
            start = time.monotonic()
            events = _faults(pool, plan, start)
            time.sleep(tail_s)
        records = load.snapshot()  # the load stopped: every request has ended
        whole = pool.whole_now()
    return {
        "benchmark": "faults",
        "command": "python -m bench.run faults" + (" --quick" if quick else ""),
        "seed": SEED,
        "clients": CLIENTS,
        "pool": pool.describe(),
        "plan": [{"at_s": round(WARMUP_S + at, 1), "fault": fault} for at, fault in plan],
        "faults": events,
        "requests": summarise(records, start),
        "pool_whole_at_end": whole,
        "duration_s": round(max(r.ended for r in records) - start, 1) if records else 0.0,
    }


def format_table(result: dict[str, Any]) -> str:
    lines = ["fault                       at (s)  recovered in (s)"]
    for event in result["faults"]:
        lines.append(f"{event['fault']:<27} {event['at_s']:>6}  {event['recovered_s']}")
    req = result["requests"]
    lines.append(f"requests: {req['sent']} sent, {req['ok']} ok, {req['failed']} failed "
                 f"{req['failed_by_cause']}; hangs {req['hangs']}, truncated silently "
                 f"{req['truncated_silently']}; pool whole at the end: "
                 f"{result['pool_whole_at_end']}")  # fmt: skip
    return "\n".join(lines)
