"""End to end on a real node: the chart installed (its operator runs from the operator image
in a container), a GenPool of two SmolLM2 CPU workers from the worker image in
target_output_tps mode, loaded; status, printer columns, tuning and Events watched; scaled
to one under load without a failed request (the kubelet runs the preStop drain within
terminationGracePeriodSeconds); deleted, and its children go."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from genpool_core.names import (
    API_GROUP,
    API_KIND,
    API_PLURAL,
    API_VERSION,
    GROUP_VERSION,
    pool_label_selector,
)
from genpool_devcluster.demo import DEMO_SPEC, run_load
from tests.conftest import DevCluster, Kubectl
from tests.integration.operator_harness import get_pool, ready_pods
from tests.polling import wait_for

POOL = "smollm2"
# Long enough that stats windows with completions come while the checks below read them
# on a slow hour too (a window without completions has no Below-T).
LOAD_S = 120
# The demo's pool (two SmolLM2 CPU workers, TargetOutputTps), with faster stats rounds.
POOL_SPEC: dict[str, Any] = {**DEMO_SPEC, "tuning": {"intervalSeconds": 6, "cooldownIntervals": 1}}


class BackgroundLoad:
    """The demo's load generator on its own thread, joined at the end of the test."""

    def __init__(self, kubeconfig: Path, namespace: str, clients: int) -> None:
        self.summary: dict[str, Any] = {}
        self._thread = threading.Thread(
            target=lambda: self.summary.update(
                run_load(kubeconfig, clients, LOAD_S, namespace=namespace, pool=POOL)
            ),
            daemon=True,
        )

    def start(self) -> BackgroundLoad:
        self._thread.start()
        return self

    def join(self, timeout: float) -> dict[str, Any]:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "load generator did not finish"
        return self.summary


def _printer_columns(kubectl: Kubectl, namespace: str) -> dict[str, str]:
    """``kubectl get gp -o wide`` parsed by the header's column positions (a value
    may be empty, so splitting on whitespace would shift the columns)."""
    header, row = kubectl("get", "gp", POOL, "-n", namespace, "-o", "wide").stdout.splitlines()[:2]
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    ends = [*starts[1:], max(len(header), len(row)) + 1]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}


# The kubelet tests' pools start first: their waits overlap with this test's.
@pytest.mark.usefixtures("pools")
def test_helm_install_genpool_load_scale_delete(
    cluster: DevCluster, kubectl: Kubectl, kube_api: client.ApiClient, namespace: str, chart: str
) -> None:
    pool = {
        "apiVersion": GROUP_VERSION,
        "kind": API_KIND,
        "metadata": {"name": POOL},
        "spec": POOL_SPEC,
    }
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(pool))
    wait_for(
        lambda: get_pool(kube_api, namespace, POOL).get("status", {}).get("readyReplicas") == 2,
        timeout=240,
        what="readyReplicas 2",
    )
    load = BackgroundLoad(cluster.kubeconfig, namespace, clients=12).start()
    status = wait_for(
        lambda: (
            (s := get_pool(kube_api, namespace, POOL).get("status", {}))
            and s.get("statsUpdatedAt")
            and s.get("workersReporting") == 2
            and s.get("preemption", {}).get("waiters") is not None
            and s.get("tuning", {}).get("lastReason")
            and s
        ),
        timeout=60,
        what="stat lines in status.preemption and a tuner decision",
    )
    # A window without completions has no below-T: wait for one that has.
    columns = wait_for(
        lambda: (c := _printer_columns(kubectl, namespace))["BELOW-T"] and c,
        timeout=120,  # two 30 s windows and more: a slow hour's first replies come late
        what="a Below-T value in kubectl get gp",
    )
    assert columns["READY"] == "2/2" and columns["MODE"] == "TargetOutputTps"
    assert columns["HEADROOM"].isdigit() and columns["CAP"].isdigit(), columns
    assert columns["CREDIT"], columns
    assert columns["INSYNC"] == "2/2" and columns["LAST-TUNE"] is not None, columns
    print("kubectl get gp -o wide:", columns)
    events = json.loads(
        kubectl(
            "get",
            "events",
            "-n",
            namespace,
            "-o",
            "json",
            "--field-selector",
            f"involvedObject.name={POOL}",
        ).stdout
    )["items"]
    assert {e["reason"] for e in events} & {"ChildrenApplied", "Tuned"}, events
    kubectl("scale", "gp", POOL, "-n", namespace, "--replicas=1")
    wait_for(
        lambda: (
            len(ready_pods(kube_api, namespace, POOL)) == 1
            and get_pool(kube_api, namespace, POOL)["status"].get("readyReplicas") == 1
        ),
        timeout=120,
        what="scale to 1",
    )
    summary = load.join(timeout=180)
    print("e2e load:", json.dumps(summary), "tuning:", json.dumps(status.get("tuning")))
    assert summary["requests"] > 20, summary
    assert summary["failed"] == 0, summary
    client.CustomObjectsApi(kube_api).delete_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, API_PLURAL, POOL
    )
    wait_for(
        lambda: (
            not kubectl(
                "get",
                "statefulsets,services,configmaps,pdb,pods",
                "-n",
                namespace,
                "-l",
                pool_label_selector(POOL),
                "-o",
                "name",
            ).stdout.strip()
        ),
        timeout=120,
        what="children gone after delete",
    )
