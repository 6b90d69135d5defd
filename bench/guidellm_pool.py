"""guidellm, unmodified from PyPI, against a GenPool of synthetic workers through its
Service on the local cluster's real node: pausing vs off.

``bench/guidellm_bench.py`` runs guidellm against one worker process; this runs it as a
user meets a pool: ``genpool devcluster up`` (a kubelet node), the chart installed with
helm (its operator in a container), two GenPools of ``REPLICAS`` synthetic workers each
(containers from the worker image), one pausing (``TargetOutputTps``, T =
``TARGET_OUTPUT_TPS``) and one not (``Off``), and guidellm on this host sending to each
pool's ClusterIP Service in turn (kube-proxy picks a pod per connection). The load and the
report are guidellm_bench's (the same scenario, prompts and SLO) at ``REPLICAS`` times the
rate. Each pod's own counters (completed requests, pauses) are read from its /metrics after
its pool's run, so the table shows how the Service spread the load. The operator is
installed by the demo's own steps (``demo._install_operator``: the CRDs, ``helm upgrade
--install``, a restart so the pod runs this checkout's image), shared rather than copied.

    python -m bench.run guidellm_pool    # writes bench/results/guidellm_pool.json
"""

from __future__ import annotations

import functools
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.guidellm_bench import (
    DATA,
    RATE,
    SLO_TTFT_MS,
    TARGET_OUTPUT_TPS,
    guidellm_binary,
    scenario,
    summarize,
)
from bench.guidellm_bench import format_table as format_policies
from genpool_core.names import API_KIND, GROUP_VERSION, POOL_LABEL, WORKER_PORT
from genpool_devcluster import cli
from genpool_devcluster.demo import NAMESPACE, Tools, _install_operator, pool_ready, wait
from genpool_operator.builders import service_name

REPLICAS = 2
POOL_RATE = RATE * REPLICAS  # requests/s: just past the pool's capacity, as for one worker
FULL_REQUESTS, QUICK_REQUESTS = 320, 40
SPEC: dict[str, Any] = {
    "replicas": REPLICAS,
    "model": "synthetic:demo",
    "accelerator": "none",
    "engine": {"maxBatchSize": 16},  # guidellm_bench's worker: --max-batch-size 16
    "drain": {"timeoutSeconds": 30},
    "podTemplate": {"env": [{"name": "OMP_NUM_THREADS", "value": "1"}]},
}
POLICIES: dict[str, dict[str, Any]] = {
    "pausing": {"mode": "TargetOutputTps", "targetOutputTps": TARGET_OUTPUT_TPS},
    "off": {"mode": "Off"},
}
POOL_PREFIX = "guidellm-"  # in the demo's namespace, beside (not instead of) its pools
POD_COUNTERS = ("genpool_completed", "genpool_pauses")


def pool_name(policy: str) -> str:
    return POOL_PREFIX + policy


def apply_pools(tools: Tools) -> None:
    """Both GenPools, created at once (idle synthetic workers cost next to nothing)."""
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    tools.run("kubectl", "apply", "-f", "-", stdin=yaml.safe_dump(namespace))
    for policy, preemption in POLICIES.items():
        manifest = {"apiVersion": GROUP_VERSION, "kind": API_KIND,
                    "metadata": {"name": pool_name(policy)},
                    "spec": SPEC | {"preemption": preemption}}  # fmt: skip
        tools.run("kubectl", "apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(manifest))
    for policy in POLICIES:
        name = pool_name(policy)
        wait(functools.partial(pool_ready, tools, name), f"pool {name}: its workers ready", 300)


def service_url(tools: Tools, pool: str) -> str:
    """The pool's ClusterIP Service, as a client in the cluster would address it."""
    service = json.loads(tools.run("kubectl", "get", "svc", service_name(pool), "-n",
                                   NAMESPACE, "-o", "json"))  # fmt: skip
    return f"http://{service['spec']['clusterIP']}:{WORKER_PORT}"


def pod_counters(tools: Tools, pool: str) -> dict[str, dict[str, float]]:
    """Each of the pool's pods: its completed requests and pauses, from its /metrics."""
    pods = json.loads(tools.run("kubectl", "get", "pods", "-n", NAMESPACE, "-l",
                                f"{POOL_LABEL}={pool}", "-o", "json"))  # fmt: skip
    return {
        pod["metadata"]["name"]: counters_of(
            httpx.get(f"http://{pod['status']['podIP']}:{WORKER_PORT}/metrics", timeout=10).text
        )
        for pod in pods["items"]
    }


def counters_of(metrics_text: str) -> dict[str, float]:
    """``POD_COUNTERS`` from a worker's /metrics (summed over their labels; 0 if absent)."""
    found = dict.fromkeys(POD_COUNTERS, 0.0)
    for family in text_string_to_metric_families(metrics_text):
        if family.name in found:
            found[family.name] = sum(sample.value for sample in family.samples
                                     if sample.name.endswith("_total"))  # fmt: skip
    return found


def run_pool(tools: Tools, policy: str, num_requests: int) -> dict[str, Any]:
    """guidellm against one pool's Service; its summary and the pods' own counters."""
    pool = pool_name(policy)
    url = service_url(tools, pool)
    print(f"  guidellm: {num_requests} requests at {POOL_RATE:g}/s to {pool} ({url}) ...",
          flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="genpool-guidellm-pool-") as work:
        report, config = Path(work, "report.json"), Path(work, "scenario.json")
        config.write_text(json.dumps(scenario(url, num_requests, report, rate=POOL_RATE)))
        subprocess.run([str(guidellm_binary()), "run", "-c", str(config), "--disable-console"],
                       cwd=work, check=True, capture_output=True, timeout=1800)  # fmt: skip
        summary = summarize(json.loads(report.read_text()))
    return summary | {"service": url, "pods": pod_counters(tools, pool)}


def run(*, quick: bool) -> dict[str, Any]:
    num_requests = QUICK_REQUESTS if quick else FULL_REQUESTS
    if cli.main(["up"]) != 0:
        raise RuntimeError("genpool devcluster up failed")
    tools = Tools(Path(cli.DEFAULT_STATE_DIR).expanduser() / "kubeconfig")
    _install_operator(tools)
    apply_pools(tools)
    try:
        policies = {policy: run_pool(tools, policy, num_requests) for policy in POLICIES}
    finally:
        for policy in POLICIES:
            tools.run("kubectl", "delete", "gp", pool_name(policy), "-n", NAMESPACE,
                      "--wait=true")  # fmt: skip
    return {
        "benchmark": "guidellm_pool",
        "description": "guidellm (PyPI, unmodified) against a GenPool of synthetic workers "
        "through its Service on the devcluster's kubelet node, pausing vs off",
        "quick": quick,
        "load": {"rate_per_s": POOL_RATE, "requests": num_requests, "data": DATA, "seed": 42},
        "pool": SPEC,
        "slo": {"ttft_ms": SLO_TTFT_MS, "tpot_ms": 1000.0 / TARGET_OUTPUT_TPS},
        "policies": policies,
    }


def format_table(result: dict[str, Any]) -> str:
    lines = [
        format_policies(result),
        "",
        "| policy | pod | completed | pauses |",
        "|---|---|---|---|",
    ]
    for policy, summary in result["policies"].items():
        for pod, counters in summary["pods"].items():
            lines.append(f"| {policy} | {pod} | {counters['genpool_completed']:.0f} | "
                         f"{counters['genpool_pauses']:.0f} |")  # fmt: skip
    return "\n".join(lines)
