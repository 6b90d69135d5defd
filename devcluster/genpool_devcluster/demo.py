"""``make demo``: GenPool end to end on this machine, with a readable summary.

Brings up (or reuses) the local control plane, helm-installs the chart (the operator
runs as a pod under the pod runner), applies a GenPool of two SmolLM2 CPU workers,
runs the same closed-loop load with preemption on (TargetOutputTps) and off, and
prints the pool's status, the tuner's Events and a latency table, on vs off.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from genpool_core.names import API_KIND, GROUP_VERSION
from genpool_devcluster import build, cli
from genpool_devcluster.loadgen import PodPicker, closed_loop, summarize
from genpool_operator.kube import Kube, load_config

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE, POOL = "genpool-demo", "demo"
RELEASE, OPERATOR_NS = "genpool", "genpool-system"
DEMO_SPEC: dict[str, Any] = {
    "replicas": 2,
    "model": "smollm2-135m",
    "accelerator": "none",
    "engine": {"maxBatchSize": 4, "maxSeqLen": 512},
    "preemption": {"mode": "TargetOutputTps", "targetOutputTps": 4},
    # Long enough windows for the tuner's evidence rule (>= 20 completions per window).
    "tuning": {"intervalSeconds": 10, "cooldownIntervals": 1},
    "drain": {"timeoutSeconds": 60},
    "podTemplate": {"env": [{"name": "OMP_NUM_THREADS", "value": "1"}]},
}


class Tools:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.bin = build.bin_dir()

    def run(self, tool: str, *args: str, stdin: str | None = None) -> str:
        cmd = [str(self.bin / tool), "--kubeconfig", str(self.kubeconfig), *args]
        res = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            raise SystemExit(f"{tool} {' '.join(args)} failed:\n{res.stderr}")
        return res.stdout

    def pool(self) -> dict[str, Any]:
        pool: dict[str, Any] = json.loads(
            self.run("kubectl", "get", "gp", POOL, "-n", NAMESPACE, "-o", "json")
        )
        return pool


def wait(check: Callable[[], bool], what: str, timeout: float) -> None:
    print(f"  waiting for {what} ...", flush=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1.0)
    raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")


def pool_ready(tools: Tools, generation: int | None = None) -> bool:
    status = tools.pool().get("status", {})
    if generation is not None and status.get("observedGeneration", 0) < generation:
        return False
    out = tools.run(
        "kubectl", "get", "sts", f"{POOL}-worker", "-n", NAMESPACE, "-o", "json",
        "--ignore-not-found",
    )  # fmt: skip
    if not out.strip():
        return False  # the operator has not created it yet
    sts = json.loads(out)
    counts = sts.get("status", {})
    want = sts["spec"]["replicas"]
    return bool(
        counts.get("readyReplicas") == want
        and counts.get("updatedReplicas") == want
        and counts.get("currentRevision") == counts.get("updateRevision")
        and status.get("readyReplicas") == want
    )


def run_load(
    kubeconfig: Path,
    clients: int,
    duration_s: float,
    *,
    namespace: str = NAMESPACE,
    pool: str = POOL,
) -> dict[str, Any]:
    """Closed-loop load on the pool's ready pods; returns ``loadgen.summarize``."""

    async def main() -> dict[str, Any]:
        kube = Kube(load_config(str(kubeconfig)))
        picker = PodPicker(kube, namespace, pool)
        await picker.refresh()
        stop = asyncio.Event()
        refresher = asyncio.create_task(picker.keep_fresh(stop))
        try:
            results = await closed_loop(
                picker, clients=clients, duration_s=duration_s, max_tokens=24
            )
        finally:
            stop.set()
            await refresher
            await kube.aclose()
        return summarize(results, duration_s)

    print(f"  load: {clients} clients for {duration_s:.0f} s ...", flush=True)
    return asyncio.run(main())


def latency_table(on: dict[str, Any], off: dict[str, Any]) -> str:
    rows = [
        ("requests", "requests"),
        ("failed", "failed"),
        ("p50 TTFT (s)", "ttft_p50_s"),
        ("p90 TTFT (s)", "ttft_p90_s"),
        ("mean TPOT (s)", "tpot_mean_s"),
        ("p90 E2E (s)", "e2e_p90_s"),
        ("tokens/s", "tokens_per_s"),
    ]
    lines = [f"{'':16} {'preemption on':>14} {'preemption off':>15}"]
    for label, key in rows:
        lines.append(f"{label:16} {_cell(on.get(key)):>14} {_cell(off.get(key)):>15}")
    return "\n".join(lines)


def _cell(value: object) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="genpool-demo", description=__doc__)
    parser.add_argument(
        "--clients", type=int, default=12, help="closed-loop clients, 1..256 (default: %(default)s)"
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=60.0,
        help="seconds of load per mode, 5..1800 (default: %(default)s)",
    )
    parser.add_argument("--keep", action="store_true", help="leave the demo GenPool running")
    args = parser.parse_args(argv)
    if not 1 <= args.clients <= 256 or not 5 <= args.duration <= 1800:
        parser.error("--clients must be 1..256 and --duration 5..1800")
    return args


def _install_operator(tools: Tools) -> None:
    """Helm-install the chart and wait for the operator's deployment to be ready."""
    chart = str(ROOT / "charts" / "genpool")
    tools.run("helm", "upgrade", "--install", RELEASE, chart, "-n", OPERATOR_NS,
              "--create-namespace")  # fmt: skip
    wait(lambda: tools.run("kubectl", "get", "deploy", "-n", OPERATOR_NS, "-o",
                           "jsonpath={.items[0].status.readyReplicas}") == "1",
         "the operator", 180)  # fmt: skip


def _apply_pool(tools: Tools) -> None:
    """Create the namespace and the demo GenPool (preemption on); wait for its workers."""
    tools.run("kubectl", "apply", "-f", "-", stdin=yaml.safe_dump(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}))  # fmt: skip
    manifest = {"apiVersion": GROUP_VERSION, "kind": API_KIND,
                "metadata": {"name": POOL}, "spec": DEMO_SPEC}  # fmt: skip
    tools.run("kubectl", "apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(manifest))
    wait(lambda: pool_ready(tools), "2 ready workers", 300)


def _turn_preemption_off(tools: Tools) -> None:
    """Patch the pool's mode to Off and wait for the rollout that follows."""
    patch = {"spec": {"preemption": {"mode": "Off"}}}
    out = tools.run("kubectl", "patch", "gp", POOL, "-n", NAMESPACE, "--type=merge",
                    "-p", json.dumps(patch), "-o", "json")  # fmt: skip
    generation = json.loads(out)["metadata"]["generation"]
    time.sleep(2)
    wait(lambda: pool_ready(tools, generation), "the rollout to preemption off", 300)


def _print_summary(
    tools: Tools,
    status_on: str,
    tuned: dict[str, Any],
    on: dict[str, Any],
    off: dict[str, Any],
) -> None:
    print("GenPool status (preemption on, after its load):")
    print(status_on)
    uid = tools.pool()["metadata"]["uid"]  # this run's pool, not an earlier one's
    events = tools.run("kubectl", "get", "events", "-n", NAMESPACE, "--field-selector",
                       f"involvedObject.uid={uid}", "--sort-by=.lastTimestamp")  # fmt: skip
    print("Operator events for the pool:")
    print(events)
    print("Tuning (preemption on): last reason", tuned.get("lastReason"),
          "| history", json.dumps(tuned.get("history", [])))  # fmt: skip
    print("\nLatency, same closed-loop load:")
    print(latency_table(on, off))


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    started = time.monotonic()
    print("[1/5] control plane (first run builds it from Go modules)", flush=True)
    build.ensure_binaries()
    if cli.main(["up"]) != 0:
        return 1
    tools = Tools(Path(cli.DEFAULT_STATE_DIR).expanduser() / "kubeconfig")
    print("[2/5] helm install the chart (operator pod under the pod runner)", flush=True)
    _install_operator(tools)
    print("[3/5] GenPool with preemption on (TargetOutputTps)", flush=True)
    _apply_pool(tools)
    on = run_load(tools.kubeconfig, args.clients, args.duration)
    status_on = tools.run("kubectl", "get", "gp", "-n", NAMESPACE, "-o", "wide")
    tuned = tools.pool().get("status", {}).get("tuning", {})
    print("[4/5] the same load with preemption off (a rollout: mode is a template field)")
    _turn_preemption_off(tools)
    off = run_load(tools.kubeconfig, args.clients, args.duration)
    print("[5/5] summary\n")
    _print_summary(tools, status_on, tuned, on, off)
    if not args.keep:
        tools.run("kubectl", "delete", "gp", POOL, "-n", NAMESPACE, "--wait=true")
    print(f"\ndemo finished in {time.monotonic() - started:.0f} s; the cluster stays up:")
    print(f"  export KUBECONFIG={tools.kubeconfig}   # then: kubectl get gp -A")
    print("  genpool devcluster down                 # to stop it")
    failed = on["failed"] + off["failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
