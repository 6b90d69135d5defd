"""What the interop subcommands share: names, constants, waiting, the worker's P/D counters."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
LOG_DIR = Path(os.environ.get("GENPOOL_INTEROP_LOGS", "/tmp/genpool-interop-llm-d"))
WORKER_BIN = ROOT / ".venv" / "bin" / "genpool-worker"
PREFILL_HEADER = "x-prefiller-host-port"  # llm-d pkg/common/routing/common.go
FAKE_MODE_HEADER = "x-fake-prefill"  # capture only: what the fake prefiller answers
DESTINATION = ("envoy.lb", "x-gateway-destination-endpoint")  # GIE/llm-d pkg/epp/metadata
SCORES = "x-gateway-destination-endpoint-scores"  # the same namespace, --emit-endpoint-scores
WORKER_PORT = 8000
NAMESPACE = "genpool-interop"
POOL = "pd"
REF_POOL = "pd-ref"
PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "List three prime numbers:",
)


def wait_for(check: Callable[[], Any], what: str, timeout: float, interval: float = 0.5) -> Any:
    """``check()``'s first truthy value (an exception counts as not yet), else SystemExit."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = check()
        except Exception:  # not up yet
            got = None
        if got:
            return got
        time.sleep(interval)
    raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")


def log(msg: str) -> None:
    print(f"[interop llm-d] {msg}", flush=True)


def http_ok(url: str) -> bool:
    import httpx

    return httpx.get(url, timeout=2).status_code == 200


def import_counts(text: str) -> dict[str, float]:
    """The worker's P/D counters: ``side/outcome`` and ``fallback/reason`` -> value."""
    out: dict[str, float] = {}
    for name, labels, value in re.findall(
        r"^(genpool_kv_transfers_total|genpool_kv_transfer_fallbacks_total)\{([^}]*)\} (\S+)$",
        text, re.MULTILINE,
    ):  # fmt: skip
        got = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        key = (f"{got.get('side')}/{got.get('outcome')}" if name.endswith("transfers_total")
               else f"fallback/{got.get('reason')}")  # fmt: skip
        out[key] = float(value)
    return out


def finish(failures: list[str], prefix: str = "") -> int:
    """Log the verdict (``all checks passed`` or the failures); the exit status."""
    log(prefix + ("FAILED:\n  " + "\n  ".join(failures) if failures else "all checks passed"))
    return 1 if failures else 0
