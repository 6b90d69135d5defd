"""The worker pod template of a GenPool's StatefulSet, as a plain dict (pure, no I/O).

``builders.build_statefulset`` wraps it; the names it refers to (ConfigMap, Secret) come
in as arguments so this module needs nothing from ``builders``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from genpool_core.names import (
    CONFIG_HASH_ANNOTATION,
    KV_SECRET_FILE_ENV,
    KV_SECRET_KEY,
    KV_SECRET_MOUNT_PATH,
    WORKER_PORT,
)
from genpool_core.termination import DEFAULT_TERMINATION_LOG
from genpool_core.worker_env import ADMIN_TOKEN_ENV, DRAIN_TIMEOUT_ENV, WORKER_CONFIG_ENV
from genpool_operator.spec import MODEL_MOUNT_PATH, GenPoolSpec
from genpool_operator.spec_sections import is_reserved_env

CONTAINER_NAME = "worker"
CONFIG_KEY = "worker.json"
ADMIN_TOKEN_KEY = "token"
HOME_DIR = "/home/genpool"
RUN_AS_ID = 10001
GPU_RESOURCE = "nvidia.com/gpu"
MODEL_VOLUME_NAME = "model"
KV_SECRET_VOLUME = "kv-secret"
# The preStop drain may take drain.timeoutSeconds; the process needs a little after it.
GRACE_MARGIN_S = 5


@dataclass(frozen=True, slots=True)
class PodRefs:
    """What the pod template points at, named by ``builders``."""

    labels: dict[str, str]
    config_hash: str
    configmap_name: str
    admin_secret_name: str
    kv_secret_name: str = ""  # the pool's KV secret, mounted (docs/operations.md)
    config_key: str = CONFIG_KEY  # the tier's worker.json in the ConfigMap
    role: str | None = None  # the worker's --role (None: its default, both)


def build_pod_template(spec: GenPoolSpec, image: str, refs: PodRefs) -> dict[str, Any]:
    user = spec.pod_template
    # The user's labels and annotations go first so that ours win on a clash.
    annotations = {
        **user.annotations,
        CONFIG_HASH_ANNOTATION: refs.config_hash,
        "kubectl.kubernetes.io/default-container": CONTAINER_NAME,
    }
    return {
        "metadata": {"labels": {**user.labels, **refs.labels}, "annotations": annotations},
        "spec": _pod_spec(spec, image, refs),
    }


def _pod_spec(spec: GenPoolSpec, image: str, refs: PodRefs) -> dict[str, Any]:
    user = spec.pod_template
    pod: dict[str, Any] = {
        # Workers never call the Kubernetes API and want no Service env vars.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": spec.drain.timeout_seconds + GRACE_MARGIN_S,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_ID,
            "runAsGroup": RUN_AS_ID,
            "fsGroup": RUN_AS_ID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(spec, image, refs)],
        "volumes": _volumes(spec, refs),
    }
    if user.node_selector:
        pod["nodeSelector"] = dict(user.node_selector)
    if user.tolerations:
        pod["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True) for t in user.tolerations
        ]
    if user.affinity:
        pod["affinity"] = user.affinity
    if user.priority_class_name:
        pod["priorityClassName"] = user.priority_class_name
    return pod


def _container(spec: GenPoolSpec, image: str, refs: PodRefs) -> dict[str, Any]:
    return {
        "name": CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["genpool-worker"],
        # Every other setting comes from GENPOOL_WORKER_CONFIG (worker.json).
        "args": _args(spec, refs),
        "ports": _ports(spec),
        "env": _env(spec, refs),
        "resources": _resources(spec),
        **_probes(),
        "lifecycle": {"preStop": {"exec": {"command": ["genpool-worker-drain"]}}},
        # The worker writes a fatal error's cause there; a crash that could not (killed,
        # an interpreter failure) leaves the log's tail instead. The operator's Degraded
        # condition quotes it, so the cause reaches the GenPool without `kubectl logs`.
        "terminationMessagePath": DEFAULT_TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": _volume_mounts(spec),
    }


def _args(spec: GenPoolSpec, refs: PodRefs) -> list[str]:
    """The pod's address and port, its P/D role, and its KV events (an argument, not
    worker.json: the kubelet fills in ``$(POD_IP)`` in the events' topic)."""
    args = ["--host=$(POD_IP)", f"--port={WORKER_PORT}"]
    if refs.role:
        args.append(f"--role={refs.role}")
    events = spec.kv_events_config()
    return [*args, f"--kv-events-config={events}"] if events is not None else args


def _ports(spec: GenPoolSpec) -> list[dict[str, Any]]:
    ports = [{"name": "http", "containerPort": WORKER_PORT, "protocol": "TCP"}]
    events = spec.engine.kv_events
    if events.enabled:
        ports.append({"name": "kv-events", "containerPort": events.port, "protocol": "TCP"})
    return ports


def _env(spec: GenPoolSpec, refs: PodRefs) -> list[dict[str, Any]]:
    def field(path: str) -> dict[str, Any]:
        return {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}

    ours: list[dict[str, Any]] = [
        {"name": "POD_IP", "valueFrom": field("status.podIP")},
        {"name": "POD_NAME", "valueFrom": field("metadata.name")},
        {"name": "POD_NAMESPACE", "valueFrom": field("metadata.namespace")},
        {"name": "HOME", "value": HOME_DIR},
        {
            "name": WORKER_CONFIG_ENV,
            "valueFrom": {"configMapKeyRef": {"name": refs.configmap_name, "key": refs.config_key}},
        },
        {
            "name": ADMIN_TOKEN_ENV,
            "valueFrom": {
                # optional: an operator without a token makes no Secret (see build_children).
                "secretKeyRef": {
                    "name": refs.admin_secret_name,
                    "key": ADMIN_TOKEN_KEY,
                    "optional": True,
                }
            },
        },
        {"name": DRAIN_TIMEOUT_ENV, "value": str(spec.drain.timeout_seconds)},
        {"name": KV_SECRET_FILE_ENV, "value": f"{KV_SECRET_MOUNT_PATH}/{KV_SECRET_KEY}"},
    ]
    taken = {var["name"] for var in ours}
    # The spec model already refuses reserved names; skipping them again keeps the pod
    # right even for a spec built around that check.
    user = [
        var.model_dump(by_alias=True, exclude_none=True)
        for var in spec.pod_template.env
        if var.name not in taken and not is_reserved_env(var.name)
    ]
    return ours + user


def _resources(spec: GenPoolSpec) -> dict[str, Any]:
    limits = dict(spec.resources.limits)
    requests = dict(spec.resources.requests)
    if spec.accelerator == "nvidia":
        # Extended resources must have requests == limits; one GPU per TP rank.
        limits[GPU_RESOURCE] = requests[GPU_RESOURCE] = spec.tensor_parallel_size
    resources: dict[str, Any] = {}
    if limits:
        resources["limits"] = limits
    if requests:
        resources["requests"] = requests
    return resources


def _probes() -> dict[str, Any]:
    def http_get(path: str) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "http"}}

    return {
        # Model loading can take minutes on a GPU; liveness starts once /health answers.
        "startupProbe": {**http_get("/health"), "periodSeconds": 5, "timeoutSeconds": 3,
                         "failureThreshold": 360},
        "readinessProbe": {**http_get("/ready"), "initialDelaySeconds": 1, "periodSeconds": 3,
                           "timeoutSeconds": 2, "failureThreshold": 2},
        "livenessProbe": {**http_get("/health"), "periodSeconds": 10, "timeoutSeconds": 5,
                          "failureThreshold": 6},
    }  # fmt: skip


def _needs_shared_memory(spec: GenPoolSpec) -> bool:
    # NCCL between TP ranks uses /dev/shm, which a container caps at 64 MiB.
    return spec.accelerator == "nvidia" and spec.tensor_parallel_size > 1


def _volumes(spec: GenPoolSpec, refs: PodRefs) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": "tmp", "emptyDir": {}},
        {"name": "cache", "emptyDir": {}},
        # optional: an operator without an admin token writes no KV secret (open pulls).
        {"name": KV_SECRET_VOLUME, "secret": {
            "secretName": refs.kv_secret_name, "optional": True, "defaultMode": 0o440}},
    ]  # fmt: skip
    if _needs_shared_memory(spec):
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}})
    source = spec.model_volume
    if source is not None and source.persistent_volume_claim is not None:
        claim = source.persistent_volume_claim.claim_name
        # readOnly twice (here and on the mount): the claim attaches read-only too.
        volumes.append({
            "name": MODEL_VOLUME_NAME,
            "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
        })  # fmt: skip
    elif source is not None and source.host_path is not None:
        # type Directory: a missing path fails the pod instead of creating an empty dir.
        volumes.append({
            "name": MODEL_VOLUME_NAME,
            "hostPath": {"path": source.host_path.path, "type": "Directory"},
        })  # fmt: skip
    return volumes


def _volume_mounts(spec: GenPoolSpec) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "cache", "mountPath": f"{HOME_DIR}/.cache"},
        {"name": KV_SECRET_VOLUME, "mountPath": KV_SECRET_MOUNT_PATH, "readOnly": True},
    ]
    if _needs_shared_memory(spec):
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    source = spec.model_volume
    if source is not None:
        mount: dict[str, Any] = {
            "name": MODEL_VOLUME_NAME,
            "mountPath": MODEL_MOUNT_PATH,
            "readOnly": True,
        }
        if source.sub_path:
            mount["subPath"] = source.sub_path
        mounts.append(mount)
    return mounts
