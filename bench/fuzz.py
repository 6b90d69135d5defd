"""Fuzz a real worker (issue 33): schemathesis against its own OpenAPI schema plus
hypothesis strategies for bodies, headers and handles (bench/fuzz_cases.py), thousands of
seeded cases against one ``genpool-worker`` process on loopback. Reports the cases run,
the answers by status (2xx, 4xx, 5xx) and engine deaths; the goal is 0 deaths and 0 5xx.

    python -m bench.run fuzz            # 4000+ cases, bench/results/fuzz.json
    python -m bench.run fuzz --quick    # a few hundred

The worker is the synthetic model with ``--max-seq-len 64`` and no simulated step time
(every case is short: a fuzz of the HTTP edge and the engine, not of the model's speed),
an admin token the fuzz does not send (admin endpoints answer 401/403, so no case drains
or reconfigures it), no prefill workers (so no case can make it contact any address) and
exports that expire after 0.5 s (prefill legs do not pile up held KV).
"""

from __future__ import annotations

import contextlib
import os
import platform
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import httpx

from bench.fuzz_cases import EngineDied, Tally, run_bodies, run_openapi

SEED = 33
OPENAPI_CASES_PER_OPERATION = 150  # x 2 modes x the schema's operations
BODY_CASES = 2000
QUICK = (15, 150)
WORKER_ARGS = ("--model", "synthetic:fuzz", "--max-seq-len", "64", "--synthetic-time-scale",
               "0", "--kv-export-timeout-s", "0.5", "--max-queue-length", "64")  # fmt: skip
START_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_worker(
    *extra: str, base: Sequence[str] = WORKER_ARGS
) -> tuple[str, subprocess.Popen[bytes]]:
    """A worker process on loopback (``base`` and ``extra`` its flags: the fuzz worker's
    by default), once it is ready (its URL and process)."""
    port = _free_port()
    env = dict(os.environ) | {"GENPOOL_ADMIN_TOKEN": secrets.token_hex(16)}
    process = subprocess.Popen(
        [sys.executable, "-m", "genpool_worker.worker_cli", *base, "--port", str(port),
         *extra], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the worker exited with {process.returncode}")
        try:
            if httpx.get(url + "/ready", timeout=1).status_code == 200:
                return url, process
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("the worker did not get ready")


def fuzz(url: str, openapi_cases: int, body_cases: int, seed_value: int) -> dict[str, Any]:
    """Both sources against ``url``: per source and in total."""
    report: dict[str, Any] = {}
    totals = Tally(url)
    for name, runner, count in (("openapi", run_openapi, openapi_cases),
                                ("bodies", run_bodies, body_cases)):  # fmt: skip
        tally = Tally(url)
        started = time.monotonic()
        with contextlib.suppress(EngineDied):  # recorded: no run goes on without an engine
            runner(tally, count, seed_value)
        report[name] = tally.summary() | {"seconds": round(time.monotonic() - started, 1)}
        totals.cases += tally.cases
        totals.by_class.update(tally.by_class)
        totals.by_status.update(tally.by_status)
        totals.engine_deaths += tally.engine_deaths
        totals.transport_errors += tally.transport_errors
        totals.findings.extend(tally.findings)
        if tally.engine_deaths:
            break
    report["total"] = totals.summary()
    return report


def run(*, quick: bool) -> dict[str, Any]:
    openapi_cases, body_cases = QUICK if quick else (OPENAPI_CASES_PER_OPERATION, BODY_CASES)
    url, process = start_worker()
    try:
        report = fuzz(url, openapi_cases, body_cases, SEED)
        metrics = httpx.get(url + "/metrics", timeout=10).text
    finally:
        process.terminate()
        process.wait(30)
    fallbacks = [line for line in metrics.splitlines()
                 if line.startswith("genpool_kv_transfer_fallbacks_total")]  # fmt: skip
    return {
        "benchmark": "fuzz",
        "command": "python -m bench.run fuzz" + (" --quick" if quick else ""),
        "seed": SEED,
        "worker": " ".join(WORKER_ARGS),
        "openapi_cases_per_operation_and_mode": openapi_cases,
        "body_cases": body_cases,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "worker_exit_code": process.returncode,
        "kv_fallbacks": fallbacks,
        **report,
    }


def format_table(result: dict[str, Any]) -> str:
    lines = ["source    cases   2xx   4xx   5xx  deaths  seconds"]
    for name in ("openapi", "bodies"):
        part = result.get(name)
        if part is None:
            continue
        by = part["by_class"]
        counts = (part["cases"], by.get("2xx", 0), by.get("4xx", 0), part["num_5xx"])
        lines.append(f"{name:<8} {counts[0]:>6} {counts[1]:>5} {counts[2]:>5} {counts[3]:>5} "
                     f"{part['engine_deaths']:>7} {part['seconds']:>8}")  # fmt: skip
    total = result["total"]
    lines.append(f"total    {total['cases']:>6}   5xx {total['num_5xx']}, "
                 f"engine deaths {total['engine_deaths']}")  # fmt: skip
    return "\n".join(lines)
