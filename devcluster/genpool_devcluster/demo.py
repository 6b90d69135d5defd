"""``make demo``: a GenPool keeps its SLO through a burst; the same pool, static, does not.

Brings up (or reuses) the local control plane, helm-installs the chart (the operator
runs as a pod under the pod runner) and applies two GenPools of **synthetic** workers
(``model: synthetic:demo``: real worker processes whose model sleeps the simulator's
step model, fitted to vLLM step times of Llama-2-70B on H100s, instead of computing;
a 2-core machine cannot run 3 + 1 real models): ``autoscaled`` (autoscaling 1..3,
``spec.slo``, preemption TargetOutputTps) and ``static`` (1 replica, preemption Off).
Both get the same open-loop load at the same time: quiet, a burst, quiet again, mixed
request lengths. It prints, per phase, each pool's latency, attainment at T, tokens/s
and replicas, then the operator's decisions (its Events) in order, and writes a PNG
of p90 TTFT and replicas over time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from genpool_core.names import API_KIND, GROUP_VERSION
from genpool_devcluster import build, cli
from genpool_devcluster.demo_load import (
    Phase,
    PlannedRequest,
    SentRequest,
    open_loop,
    phase_bounds,
    plan_arrivals,
)
from genpool_devcluster.demo_plot import write_plot
from genpool_devcluster.demo_report import (
    ReplicaSample,
    format_events,
    format_table,
    phase_rows,
    ttft_p90_series,
)
from genpool_devcluster.loadgen import PodPicker, run_closed_loop
from genpool_operator.kube import Kube, load_config

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "genpool-demo"
AUTO, STATIC = "autoscaled", "static"
RELEASE, OPERATOR_NS = "genpool", "genpool-system"
TARGET_TPS, SLO_TTFT_S = 10.0, 1.5
# The burst is two phases, so the table shows the pool before and after it scaled up.
PHASES = (
    Phase("quiet", 45, 1.0),
    Phase("burst", 40, 6.0),
    Phase("burst, later", 50, 6.0),
    Phase("quiet again", 150, 1.0),
)
DECISION_REASONS = ("ScaledUp", "ScaledDown", "Tuned", "SLOMissed")
BASE_SPEC: dict[str, Any] = {
    "replicas": 1,
    "model": "synthetic:demo",
    "accelerator": "none",
    "engine": {"maxBatchSize": 8, "maxSeqLen": 512},
    # Short windows: the scaler and the tuner act on 5 s of stat lines.
    "tuning": {"intervalSeconds": 5, "cooldownIntervals": 1},
    "drain": {"timeoutSeconds": 60},
    "podTemplate": {"env": [{"name": "OMP_NUM_THREADS", "value": "1"}]},
}

# tests/e2e/test_e2e.py's pool and load (the demo's before it showed autoscaling): two
# SmolLM2 CPU workers in TargetOutputTps mode under a closed loop.
DEMO_SPEC: dict[str, Any] = {
    "replicas": 2,
    "model": "smollm2-135m",
    "accelerator": "none",
    "engine": {"maxBatchSize": 4, "maxSeqLen": 512},
    "preemption": {"mode": "TargetOutputTps", "targetOutputTps": 4},
    "tuning": {"intervalSeconds": 10, "cooldownIntervals": 1},
    "drain": {"timeoutSeconds": 60},
    "podTemplate": {"env": [{"name": "OMP_NUM_THREADS", "value": "1"}]},
}


def run_load(
    kubeconfig: Path, clients: int, duration_s: float, *, namespace: str, pool: str
) -> dict[str, Any]:
    """Closed-loop load on one pool's ready pods (``loadgen.summarize``'s dict)."""
    print(f"  load: {clients} clients for {duration_s:.0f} s ...", flush=True)
    return run_closed_loop(str(kubeconfig), clients, duration_s, namespace=namespace, pool=pool)


def pool_specs() -> dict[str, dict[str, Any]]:
    """The two pools: identical but for preemption, the SLO and the scaler."""
    auto = BASE_SPEC | {
        "preemption": {"mode": "TargetOutputTps", "targetOutputTps": TARGET_TPS},
        "slo": {"ttftP90Seconds": SLO_TTFT_S, "attainment": 0.8},
        "autoscaling": {
            "enabled": True,
            "minReplicas": 1,
            "maxReplicas": 3,
            "scaleUpStabilizationSeconds": 0,
            "scaleDownStabilizationSeconds": 90,  # longer than the burst after the scale-up
            "maxStep": 2,
        },
    }
    static = BASE_SPEC | {"preemption": {"mode": "Off"}}
    return {AUTO: auto, STATIC: static}


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

    def pool(self, name: str) -> dict[str, Any]:
        pool: dict[str, Any] = json.loads(
            self.run("kubectl", "get", "gp", name, "-n", NAMESPACE, "-o", "json")
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


def pool_ready(tools: Tools, name: str) -> bool:
    """The pool's StatefulSet has all its replicas ready on the current revision."""
    out = tools.run(
        "kubectl", "get", "sts", f"{name}-worker", "-n", NAMESPACE, "-o", "json",
        "--ignore-not-found",
    )  # fmt: skip
    if not out.strip():
        return False  # the operator has not created it yet
    sts = json.loads(out)
    counts, want = sts.get("status", {}), sts["spec"]["replicas"]
    return bool(
        counts.get("readyReplicas") == want
        and counts.get("updatedReplicas") == want
        and counts.get("currentRevision") == counts.get("updateRevision")
        and tools.pool(name).get("status", {}).get("readyReplicas") == want
    )


PoolRun = tuple[list[SentRequest], list[ReplicaSample]]


def run_phased_load(kubeconfig: Path, plan: list[PlannedRequest]) -> dict[str, PoolRun]:
    """The same plan against both pools at once; ready pods sampled every second."""

    async def sample(picker: PodPicker, started: float, stop: asyncio.Event) -> list[ReplicaSample]:
        samples = []
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError, OSError):
                await picker.refresh()  # keeps the last list when the API blips
            samples.append((round(time.monotonic() - started, 2), len(picker.targets)))
            await asyncio.sleep(1.0)
        return samples

    async def main() -> dict[str, PoolRun]:
        kube = Kube(load_config(str(kubeconfig)))
        pickers = {name: PodPicker(kube, NAMESPACE, name) for name in (AUTO, STATIC)}
        for picker in pickers.values():
            await picker.refresh()
        started, stop = time.monotonic() + 1.0, asyncio.Event()
        samplers = {n: asyncio.create_task(sample(p, started, stop)) for n, p in pickers.items()}
        try:
            loads = await asyncio.gather(*(open_loop(p, plan, started) for p in pickers.values()))
        finally:
            stop.set()
            samples = {n: await task for n, task in samplers.items()}
            await kube.aclose()
        return {n: (sent, samples[n]) for n, sent in zip(pickers, loads, strict=True)}

    seconds = sum(p.duration_s for p in PHASES)
    print(f"  {len(plan)} requests over {seconds:.0f} s, the same to both pools ...", flush=True)
    return asyncio.run(main())


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="genpool-demo", description=__doc__)
    parser.add_argument("--seed", type=int, default=0, help="seed of the load (default: 0)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(tempfile.gettempdir()) / "genpool-demo",
        help="folder for the plot and the JSON summary (default: %(default)s)",
    )
    parser.add_argument("--keep", action="store_true", help="leave the demo GenPools running")
    return parser.parse_args(argv)


def _install_operator(tools: Tools) -> None:
    """Helm-install the chart and restart the operator, so it runs this checkout."""
    chart = str(ROOT / "charts" / "genpool")
    # helm installs crds/ only on first install, never upgrades it: apply the CRD so a
    # cluster kept from an older demo gets this checkout's fields (spec.autoscaling, ...).
    tools.run("kubectl", "apply", "--server-side", "--force-conflicts", "-f",
              str(ROOT / "charts" / "genpool" / "crds"))  # fmt: skip
    tools.run("helm", "upgrade", "--install", RELEASE, chart, "-n", OPERATOR_NS,
              "--create-namespace")  # fmt: skip
    # The pod runner runs the operator from the working tree: a pod left by an earlier
    # demo would still run the code it started with.
    tools.run("kubectl", "rollout", "restart", "deploy", "-n", OPERATOR_NS)
    print("  waiting for the operator ...", flush=True)
    tools.run("kubectl", "rollout", "status", "deploy", "-n", OPERATOR_NS, "--timeout=180s")


def _apply_pools(tools: Tools) -> None:
    """Create the namespace and both GenPools (1 replica each); wait for their workers."""
    tools.run("kubectl", "apply", "-f", "-", stdin=yaml.safe_dump(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}))  # fmt: skip
    for name, spec in pool_specs().items():
        manifest = {"apiVersion": GROUP_VERSION, "kind": API_KIND,
                    "metadata": {"name": name}, "spec": spec}  # fmt: skip
        tools.run("kubectl", "apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(manifest))
    for name in pool_specs():
        wait(functools.partial(pool_ready, tools, name), f"pool {name}: 1 ready worker", 300)


def _print_decisions(tools: Tools, name: str) -> None:
    """The operator's decisions for one pool: its Events in order, then its status."""
    pool = tools.pool(name)
    selector = f"involvedObject.uid={pool['metadata']['uid']}"
    events = json.loads(tools.run("kubectl", "get", "events", "-n", NAMESPACE,
                                  "--field-selector", selector, "-o", "json"))  # fmt: skip
    lines = format_events(events.get("items", []), DECISION_REASONS)
    print(f"Operator decisions for {name} (Events {', '.join(DECISION_REASONS)}), oldest first:")
    print("\n".join(f"  {line}" for line in lines) or "  (none)")
    status: dict[str, Any] = pool.get("status", {})
    slo_met: dict[str, Any] = next(
        (c for c in status.get("conditions", []) if c.get("type") == "SLOMet"), {}
    )
    scaling: dict[str, Any] = status.get("scaling") or {}
    last = scaling.get("lastChange") or {}
    print(f"  now: desiredReplicas {status.get('desiredReplicas')}, scaler says "
          f"{scaling.get('reason')}, last change {last.get('from')} -> {last.get('to')} "
          f"({last.get('reason')}); measured SLO {json.dumps(status.get('slo'))}; "
          f"SLOMet={slo_met.get('status')} {slo_met.get('reason', '')}")  # fmt: skip


def _report(tools: Tools, runs: dict[str, PoolRun], out: Path) -> int:
    """Print the per-phase table and the decisions, write the plot; the failed count."""
    bounds = phase_bounds(PHASES)
    rows = {name: phase_rows(sent, bounds, TARGET_TPS, samples)
            for name, (sent, samples) in runs.items()}  # fmt: skip
    print(f"Per phase, same open-loop load on both pools (T = {TARGET_TPS:g} tok/s, "
          f"SLO p90 TTFT <= {SLO_TTFT_S:g} s; synthetic workers):")  # fmt: skip
    print(format_table(rows, [name for name, _, _ in bounds]))
    print()
    _print_decisions(tools, AUTO)
    print()
    print(tools.run("kubectl", "get", "gp", "-n", NAMESPACE, "-o", "wide"))
    series = {name: ttft_p90_series(sent, 10.0) for name, (sent, _) in runs.items()}
    replicas = {name: samples for name, (_, samples) in runs.items()}
    busy = {p.name for p in PHASES if p.rate_per_s > PHASES[0].rate_per_s}
    plot = write_plot(series, replicas, bounds, busy, SLO_TTFT_S, out / "genpool-demo.png")
    (out / "genpool-demo.json").write_text(json.dumps({"phases": rows}, indent=2) + "\n")
    print(f"plot: {plot}")
    return sum(row["failed"] for pool_rows in rows.values() for row in pool_rows.values())


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
    print(f"[3/5] GenPools {AUTO} (autoscaling 1..3, SLO, TargetOutputTps) and {STATIC} "
          "(1 replica, preemption Off), synthetic workers", flush=True)  # fmt: skip
    _apply_pools(tools)
    print("[4/5] load: " + ", ".join(f"{p.name} {p.duration_s:g} s at {p.rate_per_s:g}/s"
                                     for p in PHASES), flush=True)  # fmt: skip
    runs = run_phased_load(tools.kubeconfig, plan_arrivals(PHASES, args.seed))
    print("[5/5] summary\n")
    failed = _report(tools, runs, args.out)
    if not args.keep:
        for name in pool_specs():
            tools.run("kubectl", "delete", "gp", name, "-n", NAMESPACE, "--wait=true")
    print(f"\ndemo finished in {time.monotonic() - started:.0f} s; the cluster stays up:")
    print(f"  export KUBECONFIG={tools.kubeconfig}   # then: kubectl get gp -A")
    print("  genpool devcluster down                 # to stop it")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
