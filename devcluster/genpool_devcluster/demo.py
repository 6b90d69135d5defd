"""``make demo``: what pausing buys at an equal SLO, on the real system.

Brings up (or reuses) the local cluster, helm-installs the chart (the operator runs in a
container from the operator image on the real node) and applies two GenPools of
**synthetic** workers (``model: synthetic:demo``: real worker processes whose model sleeps
the simulator's step model, fitted to vLLM step times of Llama-2-70B on H100s, instead of computing;
a 2-core machine cannot run six real models). Both state the same SLO and the same
autoscaling bounds: ``genpool`` (pausing in place, the knob tuner and the scaler) and
``replicas-only`` (preemption Off, the same scaler). Both get the same seeded open-loop
load at the same time: quiet, a burst, quiet again, mixed lengths, two request
classes (interactive, with llm-d's SLO headers; batch, without), sent as any client
sends them. It prints, per phase, each pool's latency, attainment per class, TPOT,
tokens/s, replicas and paused residents; then each pool's replica-seconds and their
ratio and the share of 10 s SLO windows met; then the operator's decisions (its
Events, which quote the scaler's inputs) for both pools and the inputs of each scaler's
latest round, and writes a PNG of TTFT, replicas and paused residents. Both pools run
the scaler at its defaults: each learns its replicas' capacity from its own windows.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from genpool_core.names import API_KIND, GROUP_VERSION
from genpool_devcluster import build, cli
from genpool_devcluster.demo_load import (
    CLASSES,
    PoolRun,
    phase_bounds,
    plan_arrivals,
    run_phased_load,
)
from genpool_devcluster.demo_plot import write_plot
from genpool_devcluster.demo_pools import (
    GENPOOL,
    MAX_REPLICAS,
    MIN_REPLICAS,
    PHASES,
    POOLS,
    REPLICAS_ONLY,
    SLO_ATTAINMENT,
    SLO_TTFT_S,
    SLO_WINDOW_S,
    TARGET_TPS,
    cost_summary,
    format_cost,
    pool_specs,
)
from genpool_devcluster.demo_report import (
    format_events,
    format_inputs,
    format_table,
    phase_rows,
    ttft_p90_series,
)
from genpool_devcluster.loadgen import run_closed_loop

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "genpool-demo"
RELEASE, OPERATOR_NS = "genpool", "genpool-system"
DECISION_REASONS = ("ScaledUp", "ScaledDown", "Tuned", "SLOMissed")
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
    parser.add_argument(
        "--target-utilization",
        action="append",
        default=[],
        metavar="POOL=U",
        type=_ceiling,
        help=f"expert override: pin a pool's spec.autoscaling.targetUtilization, 0 < U <= 1, the "
        f"share of the batch positions its scaler sizes a replica to fill (pools: "
        f"{', '.join(POOLS)}; default: unset, the scaler learns it); repeatable",
    )
    parser.add_argument(
        "--min-replicas",
        type=int,
        choices=range(1, MAX_REPLICAS + 1),
        default=MIN_REPLICAS,
        help=f"both pools' spec.autoscaling.minReplicas (default: %(default)s; max {MAX_REPLICAS})",
    )
    parser.add_argument(
        "--slo-ttft-p90",
        type=_seconds,
        default=SLO_TTFT_S,
        metavar="S",
        help="both pools' spec.slo.ttftP90Seconds (default: %(default)s)",
    )
    return parser.parse_args(argv)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 3600:  # the CRD's bounds of slo.ttftP90Seconds
        raise argparse.ArgumentTypeError(f"{text!r}: must be in (0, 3600] seconds")
    return value


def _ceiling(text: str) -> tuple[str, float]:
    pool, _, value = text.partition("=")
    if pool not in POOLS:
        raise argparse.ArgumentTypeError(f"unknown pool {pool!r} (pools: {', '.join(POOLS)})")
    try:
        ceiling = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: U must be a number") from None
    if not 0 < ceiling <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: U must be in (0, 1]")
    return pool, ceiling


def _install_operator(tools: Tools) -> None:
    """Helm-install the chart and restart the operator, so it runs this checkout."""
    chart = str(ROOT / "charts" / "genpool")
    # helm installs crds/ only on first install, never upgrades it: apply the CRD so a
    # cluster kept from an older demo gets this checkout's fields (spec.autoscaling, ...).
    tools.run("kubectl", "apply", "--server-side", "--force-conflicts", "-f",
              str(ROOT / "charts" / "genpool" / "crds"))  # fmt: skip
    tools.run("helm", "upgrade", "--install", RELEASE, chart, "-n", OPERATOR_NS,
              "--create-namespace")  # fmt: skip
    # The image's tag stays the chart's appVersion while its content follows the working
    # tree: an operator pod left by an earlier demo would still run the image it started
    # from (a pod runner cluster, the working tree's code then).
    tools.run("kubectl", "rollout", "restart", "deploy", "-n", OPERATOR_NS)
    print("  waiting for the operator ...", flush=True)
    tools.run("kubectl", "rollout", "status", "deploy", "-n", OPERATOR_NS, "--timeout=180s")


def _apply_pools(tools: Tools, specs: dict[str, dict[str, Any]]) -> None:
    """Create the namespace and the GenPools (minReplicas each); wait for their workers."""
    tools.run("kubectl", "apply", "-f", "-", stdin=yaml.safe_dump(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}))  # fmt: skip
    for name, spec in specs.items():
        manifest = {"apiVersion": GROUP_VERSION, "kind": API_KIND,
                    "metadata": {"name": name}, "spec": spec}  # fmt: skip
        tools.run("kubectl", "apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(manifest))
    for name in specs:
        wait(functools.partial(pool_ready, tools, name), f"pool {name}: its workers ready", 300)


def _print_decisions(tools: Tools, name: str, pinned: float | None) -> dict[str, Any]:
    """The operator's decisions for one pool: its Events in order, then its status and
    the scaler's latest inputs; returns ``status.scaling``."""
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
    print(f"  {format_inputs(scaling, pinned)}")
    return scaling


def _report(tools: Tools, runs: dict[str, PoolRun], out: Path, specs: dict[str, Any],
            provenance: dict[str, Any]) -> int:  # fmt: skip
    """Print the per-phase table, the cost and the decisions, write the plot; failed count."""
    bounds = phase_bounds(PHASES)
    slo_ttft_s = float(specs[GENPOOL]["slo"]["ttftP90Seconds"])
    rows = {name: phase_rows(sent, bounds, TARGET_TPS, samples)
            for name, (sent, samples) in runs.items()}  # fmt: skip
    classes = ", ".join(
        f"{c.name} {c.share:.0%} ({'headers ' + str(c.headers()) if c.headers() else 'no headers'})"
        for c in CLASSES
    )
    print(f"Per phase, same open-loop load on both pools (T = {TARGET_TPS:g} tok/s, SLO p90 TTFT "
          f"<= {slo_ttft_s:g} s, {SLO_ATTAINMENT:.0%} attainment; synthetic workers);\n"
          f"classes: {classes}:")  # fmt: skip
    print(format_table(rows, [name for name, _, _ in bounds]))
    print()
    cost = cost_summary(runs, bounds[-1][2], slo_ttft_s)
    print(format_cost(cost))
    print()
    scaling: dict[str, dict[str, Any]] = {}
    for name in runs:
        scaling[name] = _print_decisions(
            tools, name, specs[name]["autoscaling"].get("targetUtilization")
        )
        print()
    print(tools.run("kubectl", "get", "gp", "-n", NAMESPACE, "-o", "wide"))
    series = {name: ttft_p90_series(sent, SLO_WINDOW_S) for name, (sent, _) in runs.items()}
    samples = {name: seen for name, (_, seen) in runs.items()}
    busy = {p.name for p in PHASES if p.rate_per_s > PHASES[0].rate_per_s}
    plot = write_plot(series, samples, bounds, busy, slo_ttft_s, out / "genpool-demo.png")
    summary = {**provenance, "phases": rows, "cost": cost, "specs": specs, "scaling": scaling}
    (out / "genpool-demo.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"plot: {plot}\nsummary: {out / 'genpool-demo.json'}")
    return sum(row["failed"] for pool_rows in rows.values() for row in pool_rows.values())


def _provenance(argv: list[str] | None, seed: int) -> dict[str, Any]:
    """What produced a summary: the checkout's commit, the command, the seed."""
    here = Path(__file__).resolve().parent
    found = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                           cwd=here, check=False)  # fmt: skip
    commit = found.stdout.strip()
    args = sys.argv[1:] if argv is None else argv
    return {"commit": commit, "command": " ".join(["make demo --", *args]), "seed": seed}


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    overrides = dict(args.target_utilization)
    specs = pool_specs(overrides, args.min_replicas, args.slo_ttft_p90)
    started = time.monotonic()
    print("[1/5] control plane (first run builds it from Go modules)", flush=True)
    build.ensure_binaries()
    if cli.main(["up"]) != 0:
        return 1
    tools = Tools(Path(cli.DEFAULT_STATE_DIR).expanduser() / "kubeconfig")
    print("[2/5] helm install the chart (the operator pod on the node)", flush=True)
    _install_operator(tools)
    pinned = f", expert override targetUtilization {overrides}" if overrides else ""
    print(f"[3/5] GenPools {GENPOOL} (TargetOutputTps, tuner, scaler) and {REPLICAS_ONLY} "
          f"(preemption Off, same scaler), same SLO, autoscaling "
          f"{args.min_replicas}..{MAX_REPLICAS} at the scaler's defaults (capacity learned"
          f"{pinned}), synthetic workers", flush=True)  # fmt: skip
    _apply_pools(tools, specs)
    print("[4/5] load: " + ", ".join(f"{p.name} {p.duration_s:g} s at {p.rate_per_s:g}/s"
                                     for p in PHASES), flush=True)  # fmt: skip
    plan = plan_arrivals(PHASES, args.seed)
    runs = run_phased_load(tools.kubeconfig, plan, POOLS, NAMESPACE)
    print("[5/5] summary\n")
    args.out.mkdir(parents=True, exist_ok=True)
    failed = _report(tools, runs, args.out, specs, _provenance(argv, args.seed))
    if not args.keep:
        for name in specs:
            tools.run("kubectl", "delete", "gp", name, "-n", NAMESPACE, "--wait=true")
    print(f"\ndemo finished in {time.monotonic() - started:.0f} s; the cluster stays up:")
    print(f"  export KUBECONFIG={tools.kubeconfig}   # then: kubectl get gp -A")
    print("  genpool devcluster down                 # to stop it")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
