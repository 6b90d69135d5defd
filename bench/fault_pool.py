"""The fault run's cluster side (bench/faults.py): the local control plane, the operator,
a P/D GenPool of synthetic workers behind an InferencePool, GIE's endpoint picker and the
tests' Envoy stand-in, and the reads that say whether the pool is whole again.

The gateway and picker harnesses are the ones tests/integration uses (test_epp_sdk.py):
the same pieces, driven for longer and under faults."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client, config

from genpool_core.names import ROLE_LABEL, WORKER_PORT, pool_label_selector
from genpool_devcluster import build, procs
from genpool_devcluster.cluster import Cluster
from tests.integration.endpoint_picker import EndpointPicker
from tests.integration.epp_gateway import running_gateway
from tests.integration.inference_pool_harness import INFERENCE_OBJECTIVE_CRD, INFERENCE_POOL_CRD
from tests.integration.operator_harness import ADMIN_TOKEN, CRD_PATH, genpool, synthetic_spec

NAMESPACE = "faults"
POOL = "faults"
MODEL = "synthetic:tiny"
NUM_DECODE, NUM_PREFILL = 2, 1
PICKER = {"name": "faults-epp", "port": 9002}
START_TIMEOUT_S = 300.0
POLL_S = 0.5


@dataclass(frozen=True)
class Baseline:
    """What a fault's recovery is measured against: the pods' restart counts and the
    GenPool's resourceVersion (the operator writes its status every round)."""

    restarts: dict[str, int]
    pool_version: str


class Operator:
    """``genpool-operator`` as a local process (the chart's Deployment, here by hand)."""

    def __init__(self, kubeconfig: Path, log: Path) -> None:
        self.kubeconfig, self.log = kubeconfig, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = os.environ | {"KUBECONFIG": str(self.kubeconfig), "GENPOOL_ADMIN_TOKEN": ADMIN_TOKEN,
                            "GENPOOL_WORKER_IMAGE": "genpool/worker:faults"}  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "genpool_operator.main", "--namespace", NAMESPACE,
                 "--liveness-port", "0"], env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def kill(self) -> int:
        assert self.proc is not None
        pid = self.proc.pid
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        return pid

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


class FaultPool:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.model = MODEL
        self.rng = random.Random(33)
        self.cluster = Cluster(tmp / "cluster", bin_dir=build.ensure_binaries())
        self.operator = Operator(self.cluster.kubeconfig, tmp / "operator.log")
        self.api: client.ApiClient | None = None

    def __enter__(self) -> FaultPool:
        self.cluster.start(timeout=START_TIMEOUT_S)
        for crd in (CRD_PATH, INFERENCE_POOL_CRD, INFERENCE_OBJECTIVE_CRD):
            self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        self.kubectl("create", "namespace", NAMESPACE)
        kubeconfig = str(self.cluster.kubeconfig)
        self.api = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        self.operator.start()
        routed = {"enabled": True, "endpointPickerRef": PICKER}
        spec = synthetic_spec(
            replicas=NUM_DECODE, prefill={"replicas": NUM_PREFILL}, inferencePool=routed
        )
        client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            "genpool.dev", "v1alpha1", NAMESPACE, "genpools", genpool(POOL, spec)
        )
        if self.wait_recovered(None, START_TIMEOUT_S) is None:
            raise RuntimeError(f"the pool never became whole: {self.whole_now()}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.operator.stop()
        if self.api is not None:
            self.api.close()  # type: ignore[no-untyped-call]
        self.cluster.stop()

    def kubectl(self, *args: str) -> str:
        argv = [str(self.cluster.bin_dir / "kubectl"), "--kubeconfig",
                str(self.cluster.kubeconfig), *args]  # fmt: skip
        return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120).stdout

    def start_gateway(self, stack: ExitStack) -> str:
        """The picker for the pool and the gateway in front of it: the gateway's URL."""
        from tests.integration.endpoint_picker import epp_binary

        epp = EndpointPicker(epp_binary(), self.cluster.kubeconfig, NAMESPACE, POOL,
                             self.tmp / "epp.log", plaintext=True).start()  # fmt: skip
        stack.callback(epp.stop)
        _, url = stack.enter_context(running_gateway(f"127.0.0.1:{epp.grpc_port}"))
        url = str(url)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise RuntimeError("the gateway and picker never answered")

    # -- reads ------------------------------------------------------------------------

    def _pods(self) -> list[Any]:
        assert self.api is not None
        pods = client.CoreV1Api(self.api).list_namespaced_pod(
            NAMESPACE, label_selector=pool_label_selector(POOL), _request_timeout=5
        )
        return list(pods.items)

    def worker_pid(self, role: str) -> tuple[int, str]:
        """A ready pod of ``role`` (seeded pick) and its worker process, by its pod IP."""
        pods = [p for p in self._pods() if _is_ready(p)
                and (p.metadata.labels or {}).get(ROLE_LABEL) == role]  # fmt: skip
        pod = self.rng.choice(sorted(pods, key=lambda p: p.metadata.name))
        wanted = f"--host={pod.status.pod_ip}"
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if wanted.encode() in argv and any(b"genpool-worker" in a for a in argv[:2]):
                return int(entry.name), str(pod.metadata.name)
        raise RuntimeError(f"no worker process with {wanted}")

    def baseline(self) -> Baseline:
        assert self.api is not None
        restarts = {p.metadata.name: _restarts(p) for p in self._pods()}
        body: Any = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
            "genpool.dev", "v1alpha1", NAMESPACE, "genpools", POOL, _request_timeout=5
        )
        return Baseline(restarts, str(body["metadata"]["resourceVersion"]))

    def whole_now(self) -> dict[str, Any]:
        """Ready pods by role, and whether every decode pod knows every prefill pod."""
        pods = [p for p in self._pods() if _is_ready(p)]
        by_role: dict[str, list[Any]] = {}
        for pod in pods:
            by_role.setdefault((pod.metadata.labels or {}).get(ROLE_LABEL, ""), []).append(pod)
        prefill = sorted(f"{p.status.pod_ip}:{WORKER_PORT}" for p in by_role.get("prefill", []))
        told = all(sorted(httpx.get(f"http://{p.status.pod_ip}:{WORKER_PORT}/prefillers",
                                    timeout=5).json()["endpoints"]) == prefill
                   for p in by_role.get("decode", []))  # fmt: skip
        ready = {role: len(found) for role, found in by_role.items()}
        is_whole = ready.get("decode") == NUM_DECODE and ready.get("prefill") == NUM_PREFILL
        return {"ready": ready, "decode_told_prefill": told, "whole": is_whole and told}

    def wait_recovered(self, before: Baseline | None, timeout: float,
                       restarted: str | None = None) -> float | None:  # fmt: skip
        """When the pool is whole again, the pod ``restarted`` names has restarted and the
        operator has written the pool's status since ``before`` (monotonic s), or None at
        the timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self._is_recovered(before, restarted):
                    return time.monotonic()
            except Exception:  # the API (or a pod) is down mid-fault: not yet
                pass
            time.sleep(POLL_S)
        return None

    def _is_recovered(self, before: Baseline | None, restarted: str | None) -> bool:
        if not self.whole_now()["whole"]:
            return False
        if before is None:
            return True
        now = self.baseline()
        if restarted is not None and now.restarts.get(restarted, 0) <= before.restarts[restarted]:
            return False  # the kill is not seen yet: the pod still looks as before
        return now.pool_version != before.pool_version

    def restart_apiserver(self) -> None:
        """Stop the kube-apiserver (SIGTERM, as a node's kubelet would) and start it again."""
        proc = next(p for p in self.cluster.procs if p.name == "kube-apiserver")
        procs.stop(proc, grace=10.0)
        self.cluster.restart(proc)

    def describe(self) -> dict[str, Any]:
        return {"model": MODEL, "decode_replicas": NUM_DECODE, "prefill_replicas": NUM_PREFILL,
                "gateway": "GIE epp + tests/integration/epp_gateway.py"}  # fmt: skip


def _is_ready(pod: Any) -> bool:
    conditions = (pod.status.conditions or []) if pod.status else []
    is_deleting = pod.metadata.deletion_timestamp is not None
    return not is_deleting and any(c.type == "Ready" and c.status == "True" for c in conditions)


def _restarts(pod: Any) -> int:
    statuses = (pod.status.container_statuses or []) if pod.status else []
    return sum(s.restart_count or 0 for s in statuses)
