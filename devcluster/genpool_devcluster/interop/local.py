"""``local``: a prefill worker and a decode worker on loopback, the sidecar in front of the
decode worker, and (unless ``--no-epp``) llm-d's epp over the two (file discovery, role
labels) choosing the prefiller per request: the protocol end to end without a cluster.
The reference text is the decode worker's own (plain request: local prefill).
``--host-override`` also sends each request with ``Host: <prefiller>`` (a diagnostic: the
worker names its pull address from the connection, never from Host)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genpool_devcluster.interop.children import epp_proc, running, sidecar_proc, worker_proc
from genpool_devcluster.interop.common import (
    LOG_DIR,
    PREFILL_HEADER,
    PROMPTS,
    finish,
    http_ok,
    import_counts,
    log,
)
from genpool_devcluster.interop.epp_client import pd_completion
from genpool_devcluster.interop.epp_config import epp_file_discovery_config
from genpool_devcluster.procs import free_port


def _start_workers(stack: ExitStack, model: str, ports: dict[str, int]) -> None:
    for role, port in ports.items():
        proc = worker_proc(f"worker-{role}-{port}", model, port, "--role", role)
        ready = functools.partial(http_ok, f"http://127.0.0.1:{port}/v1/models")
        stack.enter_context(running(proc, ready, f"the {role} worker", 300))


def _start_sidecar(stack: ExitStack, bin_dir: Path, decode_port: int) -> str:
    """The sidecar in front of the decode worker; its base URL."""
    side_port = free_port()
    side = sidecar_proc(bin_dir, side_port, decode_port)
    health = f"http://127.0.0.1:{side_port}/health"
    stack.enter_context(running(side, lambda: http_ok(health), "the sidecar serving", 60))
    return f"http://127.0.0.1:{side_port}"


def _start_epp(stack: ExitStack, bin_dir: Path, ports: dict[str, int]) -> str:
    """The epp over both workers (file discovery, ``llm-d.ai/role`` labels); its address."""
    import yaml

    LOG_DIR.mkdir(parents=True, exist_ok=True)
    endpoints = LOG_DIR / "epp-endpoints.yaml"
    entries = [
        {
            "name": f"worker-{role}",
            "address": "127.0.0.1",
            "port": str(port),
            "labels": {"llm-d.ai/role": role},
        }
        for role, port in ports.items()
    ]
    endpoints.write_text(yaml.safe_dump({"endpoints": entries}))
    epp, grpc_port, metrics_port = epp_proc(
        bin_dir, epp_file_discovery_config(endpoints), pool="local",
        namespace="default", kubeconfig=None)  # fmt: skip
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    stack.enter_context(running(epp, lambda: http_ok(metrics), "the epp serving", 120))
    time.sleep(3)  # its first scrape of both workers
    return f"127.0.0.1:{grpc_port}"


def _counts(port: int) -> dict[str, float]:
    import httpx

    return import_counts(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)


@dataclass
class LocalRun:
    """The two workers, the sidecar in front of the decode one, the epp (None: no epp)."""

    model: str
    max_tokens: int
    ports: dict[str, int]
    sidecar: str
    epp_address: str | None

    def check(self, direct: Any, label: str, headers: dict[str, str], prompt: str) -> list[str]:
        """One prompt through the sidecar against the decode worker's own text (``direct``,
        its SDK client); the failures."""
        decode, prefiller = self.ports["decode"], f"127.0.0.1:{self.ports['prefill']}"
        body = {"model": self.model, "prompt": prompt, "max_tokens": self.max_tokens,
                "temperature": 0}  # fmt: skip
        want = direct.completions.create(**body).choices[0].text
        before = _counts(decode)
        got, picked, chosen = asyncio.run(
            pd_completion(self.epp_address, self.sidecar, body, headers)
        )
        after = _counts(decode)
        delta = {k: after[k] - before.get(k, 0.0) for k in after
                 if after[k] != before.get(k, 0.0)}  # fmt: skip
        log(f"[{label}] {prompt[:30]!r}: epp decode {picked or '-'}, prefiller "
            f"{chosen}; P/D {got!r}, local {want!r}; decode worker {delta}")  # fmt: skip
        failures = []
        if self.epp_address and picked != f"127.0.0.1:{decode}":
            failures.append(f"[{label}] epp's decode pick {picked!r} is not the decode worker")
        if chosen != prefiller:
            failures.append(f"[{label}] prefiller {chosen!r} is not {prefiller}")
        if got != want:
            failures.append(f"[{label}] {prompt!r}: {got!r} != {want!r}")
        if delta.get("import/ok") != 1:
            failures.append(f"[{label}] {prompt!r}: import ok +"
                            f"{delta.get('import/ok', 0):g}, not +1: {delta}")  # fmt: skip
        return failures


def local(args: argparse.Namespace) -> int:
    import openai

    bin_dir: Path = args.bin
    ports = {"prefill": free_port(), "decode": free_port()}
    prefiller = f"127.0.0.1:{ports['prefill']}"
    failures: list[str] = []
    with ExitStack() as stack:
        _start_workers(stack, args.model, ports)
        sidecar = _start_sidecar(stack, bin_dir, ports["decode"])
        epp_address = None if args.no_epp else _start_epp(stack, bin_dir, ports)
        setup = LocalRun(args.model, args.max_tokens, ports, sidecar, epp_address)
        direct = openai.OpenAI(base_url=f"http://127.0.0.1:{ports['decode']}/v1",
                               api_key="unused", max_retries=0)  # fmt: skip
        base_headers = {} if epp_address else {PREFILL_HEADER: prefiller}
        variants = [("as sent", base_headers)]
        if args.host_override:
            variants.append(("Host: prefiller", {**base_headers, "Host": prefiller}))
        for label, headers in variants:
            for prompt in PROMPTS:
                failures += setup.check(direct, label, headers, prompt)
        log(f"prefill worker: {_counts(ports['prefill'])}")
    return finish(failures)
