"""Operator benchmarks (``python -m bench.run operator``).

- ``scrape``: one stats round over 50 pools x 4 pods against fake workers on
  loopback addresses: each pool reads its pods' stat lines and checks/pushes the live
  config, all pools concurrently, as the daemons do. Steady state (pods already in
  sync) and the first round (every pod gets a ``PUT /config``) are reported apart.
- ``reconcile``: against the local control plane (``genpool_devcluster``) with the
  operator running as a process: time from creating a GenPool to all of its children
  existing. Runs only when the control-plane binaries are built; otherwise the
  result says why it was not measured.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx

from genpool_core.live import LiveUpdate
from genpool_operator.scrape import PodTarget, WorkerClient
from genpool_operator.statsloop import push_live

POOLS, PODS_PER_POOL = 50, 4
PORT = 18777
LIVE = LiveUpdate(generation=0, resident_headroom=8, paused_cap=6, slack_s=0.5)


async def _one_round(client: WorkerClient, pools: list[list[PodTarget]], generation: int) -> None:
    async def pool_round(targets: list[PodTarget]) -> None:
        lines = await client.gather(client.statlines, targets)
        assert all(lines), lines
        synced, errors = await push_live(
            client, targets, LIVE.model_copy(update={"generation": generation})
        )
        assert not errors and synced == len(targets), errors

    await asyncio.gather(*(pool_round(targets) for targets in pools))


def _fleet_hosts(count: int) -> list[str]:
    return [f"127.0.{1 + i // 250}.{1 + i % 250}" for i in range(count)]


async def _scrape(rounds: int) -> dict[str, Any]:
    count = POOLS * PODS_PER_POOL
    # The fakes run in their own process: the CPU time measured here is the operator's.
    fleet = subprocess.Popen(
        [sys.executable, "-m", "bench.fake_workers", str(count), str(PORT)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert fleet.stdout is not None and fleet.stdout.readline().strip() == "ready"
    targets = [PodTarget(f"pod-{i}", host, "") for i, host in enumerate(_fleet_hosts(count))]
    pools = [targets[i : i + PODS_PER_POOL] for i in range(0, len(targets), PODS_PER_POOL)]
    try:
        async with httpx.AsyncClient() as http:
            client = WorkerClient(http, None, port=PORT)
            start = time.perf_counter()
            await _one_round(client, pools, generation=1)
            first_s = time.perf_counter() - start
            walls, cpus = [], []
            for _ in range(rounds):
                wall0, cpu0 = time.perf_counter(), time.process_time()
                await _one_round(client, pools, generation=1)
                walls.append(time.perf_counter() - wall0)
                cpus.append(time.process_time() - cpu0)
    finally:
        fleet.terminate()
        fleet.wait(10)
    return {
        "pools": POOLS,
        "pods_per_pool": PODS_PER_POOL,
        "rounds": rounds,
        "first_round_with_puts_s": round(first_s, 4),
        "steady_round_wall_s": {
            "median": round(statistics.median(walls), 4),
            "p90": round(sorted(walls)[int(0.9 * (len(walls) - 1))], 4),
        },
        "steady_round_cpu_s_median": round(statistics.median(cpus), 4),
        "requests_per_steady_round": POOLS * PODS_PER_POOL * 2,
        "note": "fake workers run in a separate process on 200 loopback addresses; CPU "
        "time is the operator side only (httpx client, stat-line parsing, sync checks)",
    }


def run(*, quick: bool) -> dict[str, Any]:
    result: dict[str, Any] = {"scrape": asyncio.run(_scrape(3 if quick else 20))}
    from bench.operator_reconcile import measure_reconcile

    result["reconcile"] = measure_reconcile(repeats=2 if quick else 8)
    return result


def format_table(result: dict[str, Any]) -> str:
    scrape = result["scrape"]
    lines = [
        f"scrape round, {scrape['pools']} pools x {scrape['pods_per_pool']} pods: "
        f"median {scrape['steady_round_wall_s']['median'] * 1000:.0f} ms wall "
        f"(p90 {scrape['steady_round_wall_s']['p90'] * 1000:.0f} ms), "
        f"cpu {scrape['steady_round_cpu_s_median'] * 1000:.0f} ms; "
        f"first round with PUTs {scrape['first_round_with_puts_s'] * 1000:.0f} ms",
    ]
    rec = result.get("reconcile") or {}
    if "median_s" in rec:
        lines.append(
            f"reconcile apply -> children exist: median {rec['median_s'] * 1000:.0f} ms, "
            f"max {rec['max_s'] * 1000:.0f} ms over {rec['repeats']}"
        )
    else:
        lines.append(f"reconcile: not measured ({rec.get('skipped', 'unknown')})")
    return "\n".join(lines)
