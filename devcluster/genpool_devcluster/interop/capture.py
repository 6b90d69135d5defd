"""``capture``: the sidecar between recording fakes, then in front of a real worker; the
exact legs it sends, written as JSON."""

from __future__ import annotations

import argparse
import json
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from genpool_devcluster.interop.children import running, sidecar_proc, worker_proc
from genpool_devcluster.interop.common import FAKE_MODE_HEADER, PREFILL_HEADER, http_ok, log
from genpool_devcluster.interop.fakes import (
    Recorder,
    fake_decode_answer,
    fake_prefill_answer,
    serving,
)
from genpool_devcluster.procs import free_port

RETRY_FLAGS = ("--prefill-max-retries=2", "--prefill-retry-backoff=100ms")
WORKER_CASES = ("completions", "no-header-passthrough", "prefill-without-kv_transfer_params")


def _client_call(
    base: str, path: str, body: dict[str, Any], headers: dict[str, str]
) -> dict[str, Any]:
    import httpx

    with httpx.Client(timeout=60) as http:
        reply = http.post(base + path, json=body, headers=headers)
    return {
        "status": reply.status_code,
        "headers": [[k, v] for k, v in reply.headers.items()],
        "body": reply.text,
    }


def capture_cases(
    prefiller: str, dead: str
) -> list[tuple[str, str, dict[str, Any], dict[str, str]]]:
    """(name, path, client body, client headers) of each exchange to capture."""
    completion = {
        "model": "synthetic:tiny",
        "prompt": "The capital of France is",
        "max_tokens": 7,
        "temperature": 0,
        "seed": 9007199254740993,  # 2**53 + 1: the sidecar re-encodes numbers as float64
    }
    chat = {
        "model": "synthetic:tiny",
        "messages": [{"role": "user", "content": "Capital of France?"}],
        "max_completion_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with_header = {PREFILL_HEADER: prefiller, "x-request-id": "client-request-1"}
    return [
        ("completions", "/v1/completions", completion, with_header),
        ("chat-streamed", "/v1/chat/completions", chat, {PREFILL_HEADER: prefiller}),
        ("prefill-without-kv_transfer_params", "/v1/completions", completion,
         {PREFILL_HEADER: prefiller, FAKE_MODE_HEADER: "no-kv"}),
        ("prefill-503", "/v1/completions", completion,
         {PREFILL_HEADER: prefiller, FAKE_MODE_HEADER: "status-503"}),
        ("prefiller-unreachable", "/v1/completions", completion, {PREFILL_HEADER: dead}),
        ("two-prefillers-in-header", "/v1/completions", completion,
         {PREFILL_HEADER: f"{prefiller}, {dead}"}),
        ("no-header-passthrough", "/v1/completions", completion, {}),
    ]  # fmt: skip


def _run_cases(
    base: str, cases: list[Any], prefill: Recorder, decode: Recorder | None
) -> list[dict[str, Any]]:
    out = []
    for name, path, body, headers in cases:
        seen_p, seen_d = len(prefill.records), len(decode.records) if decode else 0
        client = _client_call(base, path, body, headers)
        time.sleep(0.2)
        out.append({
            "case": name,
            "client_request": {"path": path, "headers": headers, "body": body},
            "prefill_legs": prefill.records[seen_p:],
            "decode_legs": decode.records[seen_d:] if decode else "(the real worker: see reply)",
            "client_reply": client,
        })  # fmt: skip
        log(f"{name}: client got {client['status']}, "
            f"{len(prefill.records) - seen_p} prefill leg(s)")  # fmt: skip
    return out


def capture(args: argparse.Namespace) -> int:
    bin_dir: Path = args.bin
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    results: dict[str, Any] = {"sidecar": str(bin_dir / "pd-sidecar")}
    with ExitStack() as stack:
        prefill = stack.enter_context(serving(Recorder("fake-prefiller", fake_prefill_answer)))
        decode = stack.enter_context(serving(Recorder("fake-decoder", fake_decode_answer)))
        prefiller = f"127.0.0.1:{prefill.port}"
        port = free_port()
        side = sidecar_proc(bin_dir, port, decode.port, *RETRY_FLAGS)
        results["sidecar_argv_fakes"] = side.argv
        health = f"http://127.0.0.1:{port}/health"
        with running(side, lambda: http_ok(health), "the sidecar serving", 60):
            base = f"http://127.0.0.1:{port}"
            results["fake_decoder"] = _run_cases(base, capture_cases(prefiller, dead), prefill,
                                                 decode)  # fmt: skip
        if not args.no_worker:
            _capture_worker(args, stack, results, prefill, dead)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    log(f"exchange written to {args.out}")
    return 0


def _capture_worker(args: argparse.Namespace, stack: ExitStack, results: dict[str, Any],
                    prefill: Recorder, dead: str) -> None:  # fmt: skip
    """The sidecar in front of a real ``genpool-worker`` (the fake prefiller still prefills)."""
    wport = free_port()
    worker = worker_proc(f"genpool-worker-{wport}", args.worker_model, wport)
    results["worker_argv"] = worker.argv
    up = f"http://127.0.0.1:{wport}/v1/models"
    stack.enter_context(running(worker, lambda: http_ok(up), "the worker serving", 300))
    port = free_port()
    side = sidecar_proc(args.bin, port, wport, *RETRY_FLAGS)
    results["sidecar_argv_worker"] = side.argv
    health = f"http://127.0.0.1:{port}/health"
    with running(side, lambda: http_ok(health), "the sidecar serving", 60):
        prefiller = f"127.0.0.1:{prefill.port}"
        cases = [c for c in capture_cases(prefiller, dead) if c[0] in WORKER_CASES]
        for case in cases:
            case[2]["model"] = args.worker_model
            case[2].pop("seed", None)
        base = f"http://127.0.0.1:{port}"
        results["real_worker"] = _run_cases(base, cases, prefill, None)
