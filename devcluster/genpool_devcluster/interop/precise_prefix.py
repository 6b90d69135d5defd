"""``precise-prefix``: llm-d's unmodified epp with its precise prefix-cache scorer over a
GenPool of two workers on the local control plane. The operator (Helm chart) runs the
GenPool (``engine.kvEvents.enabled``: each worker publishes its prefix cache's KV events
on its pod IP, port 5557) with an InferencePool; the epp finds the pods through the
InferencePool (Kubernetes discovery), dials each pod's KV events, tokenizes through a
worker's render endpoints and scores with ``precise-prefix-cache-producer`` +
``prefix-cache-scorer``. The multi-turn load (``conversations``) asks the epp for each
request's pick over ext_proc as Envoy would, sends it to that pod, and records where each
turn ran and what the worker's prefix cache held. Runs: ``events`` (KV events on) and
``control`` (a second GenPool with KV events off: the same picker, nothing to score).
Writes bench/results/kv_events_interop_cluster.json."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genpool_core.names import DEFAULT_KV_EVENTS_PORT
from genpool_devcluster.interop.children import epp_proc, running
from genpool_devcluster.interop.cluster_run import control_plane, install, pods_of
from genpool_devcluster.interop.common import NAMESPACE, ROOT, WORKER_PORT, http_ok, log, wait_for
from genpool_devcluster.interop.conversations import Conversation, as_rows, summarise
from genpool_devcluster.interop.prefix_epp import (
    EPP_METRIC,
    EppWatch,
    converse,
    precise_prefix_config,
    probe_request,
    provenance,
    scrape,
    subscribed_endpoints,
)

if TYPE_CHECKING:
    from genpool_devcluster.demo import Tools

RESULTS = ROOT / "bench" / "results" / "kv_events_interop_cluster.json"
MODES = ("events", "control")
POOLS = {"events": "prefix", "control": "prefix-control"}
REPLICAS = 2
READY_TIMEOUT_S = 600


def pool_spec(model: str, block_size: int, events: bool) -> dict[str, Any]:
    """The GenPool: two workers, prefix caching with KV events on or off, an
    InferencePool (its picker reference names a Service nobody serves: the driver asks
    the epp itself, as Envoy would)."""
    spec: dict[str, Any] = {
        "replicas": REPLICAS,
        "model": model,
        "accelerator": "none",
        "preemption": {"mode": "Off"},
        "engine": {"kvBlockSize": block_size, "enablePrefixCaching": True,
                   "kvEvents": {"enabled": events}},
        "inferencePool": {"enabled": True,
                          "endpointPickerRef": {"name": "prefix-epp", "port": 9002}},
    }  # fmt: skip
    cpu, memory = ("100m", "256Mi") if model.startswith("synthetic:") else ("1", "1Gi")
    spec["resources"] = {"requests": {"cpu": cpu, "memory": memory}}
    return spec


def ready_pods(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The Ready pods with an IP, by name: their IP and their worker container's args."""
    out: dict[str, dict[str, Any]] = {}
    for pod in items:
        status = pod.get("status") or {}
        conditions = status.get("conditions") or []
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        if ready and status.get("podIP") and not pod["metadata"].get("deletionTimestamp"):
            container = pod["spec"]["containers"][0]
            out[pod["metadata"]["name"]] = {"ip": status["podIP"],
                                            "args": container.get("args", [])}  # fmt: skip
    return dict(sorted(out.items()))


def _apply(tools: Tools, name: str, spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The GenPool applied; its ready pods once both are."""
    import yaml

    from genpool_core.names import API_KIND, GROUP_VERSION

    tools.run("kubectl", "apply", "-f", "-", stdin=yaml.safe_dump(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}))  # fmt: skip
    manifest = {"apiVersion": GROUP_VERSION, "kind": API_KIND, "metadata": {"name": name},
                "spec": spec}  # fmt: skip
    tools.run("kubectl", "apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(manifest))

    def both_ready() -> dict[str, dict[str, Any]] | None:
        pods = ready_pods(pods_of(tools, name))
        return pods if len(pods) == REPLICAS else None

    pods: dict[str, dict[str, Any]] = wait_for(both_ready, f"{name}'s {REPLICAS} pods ready",
                                               READY_TIMEOUT_S, 2)  # fmt: skip
    for pod, seen in pods.items():
        log(f"  {pod} {seen['ip']}: genpool-worker {' '.join(seen['args'])}")
    return pods


def _delete(tools: Tools, name: str) -> None:
    """The GenPool deleted, and its pods gone (their CPU free for the next run)."""
    tools.run("kubectl", "delete", "gp", name, "-n", NAMESPACE, "--ignore-not-found",
              "--wait=true")  # fmt: skip
    wait_for(lambda: not pods_of(tools, name), f"{name}'s pods gone", 180, 1)


def _serve(args: argparse.Namespace, tools: Tools, name: str, events: bool,
           pods: dict[str, dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """The epp for the GenPool's InferencePool, then the conversations through it."""
    workers = {f"{pod}-rank-0": f"http://{seen['ip']}:{WORKER_PORT}" for pod, seen in pods.items()}
    render_url = next(iter(workers.values()))
    config = precise_prefix_config(args.model, render_url, args.block_size, DEFAULT_KV_EVENTS_PORT)
    epp, grpc_port, metrics_port = epp_proc(
        args.bin, config, pool=name, namespace=NAMESPACE, kubeconfig=tools.kubeconfig,
        extra=("--emit-endpoint-scores",), binary=args.epp)  # fmt: skip
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    conversations = [Conversation(c, "chat" if c % 2 else "completions")
                     for c in range(args.conversations)]  # fmt: skip
    with ExitStack() as stack:
        stack.enter_context(running(epp, partial(http_ok, metrics), "the epp serving", 120))
        expected = {f"{NAMESPACE}/{endpoint}" for endpoint in workers}
        wait_for(lambda: expected <= subscribed_endpoints(epp.log_path), "the epp to find "
                 f"both pods through the InferencePool ({sorted(expected)})", 120)  # fmt: skip
        watch = EppWatch(metrics, workers, epp.log_path)
        if events:
            watch.join([partial(probe_request, url, args.model) for url in workers.values()])
        turns = asyncio.run(converse(
            f"127.0.0.1:{grpc_port}", conversations, [], model=args.model,
            max_tokens=args.max_tokens, turns=args.turns,
            sync=watch.sync if events else lambda: None))  # fmt: skip
        page = scrape(metrics)
    errors = {k: v for k, v in page.items() if k.startswith(f"{EPP_METRIC}zmq_errors_total")}
    received = {k: v for k, v in page.items()
                if k.startswith(f"{EPP_METRIC}messages_received_total")}  # fmt: skip
    return {"render_url": render_url, "epp_zmq_errors": errors,
            "epp_messages_received": received, "summary": summarise(turns, args.block_size),
            "turns": as_rows(turns)}  # fmt: skip


def one_run(args: argparse.Namespace, tools: Tools, mode: str) -> dict[str, Any]:
    name, events = POOLS[mode], mode == "events"
    spec = pool_spec(args.model, args.block_size, events)
    log(f"run {mode}: GenPool {NAMESPACE}/{name} ({args.model}, kvEvents.enabled={events})")
    try:
        pods = _apply(tools, name, spec)
        served = _serve(args, tools, name, events, pods)
    finally:
        if not args.keep:
            _delete(tools, name)
    return {"mode": mode, "kv_events": events, "genpool": {"name": name, "spec": spec},
            "pods": pods} | served  # fmt: skip


def precise_prefix(args: argparse.Namespace) -> int:
    modes = [m for m in args.runs.split(",") if m]
    if not modes or set(modes) - set(MODES):
        raise SystemExit(f"--runs {args.runs}: each of {', '.join(MODES)}")
    args.epp = args.bin / "epp"
    if not args.epp.is_file():
        raise SystemExit(f"{args.epp}: no epp binary")
    command = "python -m genpool_devcluster.interop " + " ".join(sys.argv[1:])
    tools = control_plane(args.state_dir)
    if tools is None:
        return 1
    install(tools)
    result = provenance(args, command) | {"state_dir": str(args.state_dir)}
    result["runs"] = [one_run(args, tools, mode) for mode in modes]
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for run in result["runs"]:
        log(f"{run['mode']}: {run['summary']}")
    log(f"wrote {out}")
    return 0
