"""Pure builders of a GenPool's children as plain dicts (docs/operator-contract.md).

Same input, same dicts: the handlers create-or-patch them idempotently. Each child is
labelled with the pool and owned by it (garbage-collected with the GenPool). With
``spec.prefill`` a second StatefulSet, ``<pool>-prefill``, runs the prefill tier beside
the GEN one (:mod:`genpool_operator.tiers`); its worker.json is the ConfigMap's second key.

``genpool.dev/config-hash`` hashes ``worker.json`` without its live fields: a live change
(slack, admission target, start knobs) rewrites the ConfigMap for pods started later and
is pushed to running pods by ``PUT /config``; it never rolls the StatefulSet.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from genpool_core.live import LIVE_FIELDS
from genpool_core.names import (
    API_KIND,
    GENERATION_ANNOTATION,
    GROUP_VERSION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    POOL_LABEL,
    PREFILL_ROLE,
    WORKER_PORT,
)
from genpool_operator.kv_secret import build_kv_secret, kv_secret_name
from genpool_operator.pod_template import ADMIN_TOKEN_KEY, CONFIG_KEY, PodRefs, build_pod_template
from genpool_operator.spec import GenPoolSpec
from genpool_operator.tiers import (
    PREFILL_CONFIG_KEY,
    gen_role,
    prefill_statefulset_name,
    role_labels,
)


@dataclass(frozen=True, slots=True)
class PoolRef:
    """The GenPool a child belongs to."""

    name: str
    namespace: str
    uid: str
    generation: int


def statefulset_name(pool: str) -> str:
    return f"{pool}-worker"


def service_name(pool: str) -> str:
    return f"{pool}-worker"


def headless_service_name(pool: str) -> str:
    return f"{pool}-worker-headless"


def configmap_name(pool: str) -> str:
    return f"{pool}-worker-config"


def pdb_name(pool: str) -> str:
    return f"{pool}-worker"


def admin_secret_name(pool: str) -> str:
    return f"{pool}-worker-admin"


def pool_labels(pool: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "genpool-worker",
        "app.kubernetes.io/instance": pool,
        MANAGED_BY_LABEL: MANAGED_BY,
        "app.kubernetes.io/part-of": "genpool",
        POOL_LABEL: pool,
    }


def pool_selector(pool: str) -> dict[str, str]:
    return {POOL_LABEL: pool}


def owner_reference(pool: PoolRef) -> dict[str, Any]:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": API_KIND,
        "name": pool.name,
        "uid": pool.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(pool: PoolRef, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": pool.namespace,
        "labels": pool_labels(pool.name),
        "ownerReferences": [owner_reference(pool)],
    }


def worker_json(spec: GenPoolSpec) -> str:
    return json.dumps(spec.worker_config(), sort_keys=True, indent=2) + "\n"


def config_hash(spec: GenPoolSpec) -> str:
    """sha256 of worker.json's template fields: it changes exactly when pods must roll."""
    template = {k: v for k, v in spec.worker_config().items() if k not in LIVE_FIELDS}
    canonical = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def build_configmap(pool: PoolRef, spec: GenPoolSpec) -> dict[str, Any]:
    metadata = _metadata(pool, configmap_name(pool.name))
    metadata["annotations"] = {GENERATION_ANNOTATION: str(pool.generation)}
    data = {CONFIG_KEY: worker_json(spec)}
    prefill = spec.prefill_tier()
    if prefill is not None:
        data[PREFILL_CONFIG_KEY] = worker_json(prefill)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def build_admin_secret(pool: PoolRef, token: str) -> dict[str, Any]:
    # data, not stringData: what is read back equals what was written, so patches are no-ops.
    encoded = base64.b64encode(token.encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(pool, admin_secret_name(pool.name)),
        "type": "Opaque",
        "data": {ADMIN_TOKEN_KEY: encoded},
    }


def _http_port() -> dict[str, Any]:
    return {"name": "http", "port": WORKER_PORT, "targetPort": "http", "protocol": "TCP"}


def build_headless_service(pool: PoolRef) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(pool, headless_service_name(pool.name)),
        "spec": {
            "clusterIP": "None",
            # Per-pod DNS even while a pod is not ready (stats and drains reach it).
            "publishNotReadyAddresses": True,
            "selector": pool_selector(pool.name),
            "ports": [_http_port()],
        },
    }


def build_service(pool: PoolRef, spec: GenPoolSpec) -> dict[str, Any]:
    # Clients reach the GEN tier (a decode worker sends the prefill leg itself; docs/pd.md).
    selector = pool_selector(pool.name) | role_labels(gen_role(spec.prefill is not None))
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(pool, service_name(pool.name)),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [_http_port()],
        },
    }


def build_pdb(pool: PoolRef) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(pool, pdb_name(pool.name)),
        "spec": {
            # maxUnavailable (not minAvailable) keeps working at any replica count, 0 included.
            "maxUnavailable": 1,
            "selector": {"matchLabels": pool_selector(pool.name)},
            # A pod that never got ready holds no requests; evicting it is always safe.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def build_statefulset(pool: PoolRef, spec: GenPoolSpec, image: str) -> dict[str, Any]:
    """The GEN tier's StatefulSet (its selector, the pool label, is immutable: it stays)."""
    role = gen_role(spec.prefill is not None)
    return _statefulset(pool, spec, image, name=statefulset_name(pool.name), role=role,
                        config_key=CONFIG_KEY)  # fmt: skip


def build_prefill_statefulset(pool: PoolRef, spec: GenPoolSpec, image: str) -> dict[str, Any]:
    """The prefill tier's StatefulSet (``spec.prefill`` set): the same worker with
    ``--role=prefill``, its own replicas, resources and worker.json."""
    tier = spec.prefill_tier()
    if tier is None:
        raise ValueError("spec.prefill is not set: there is no prefill tier")
    sts = _statefulset(pool, tier, image, name=prefill_statefulset_name(pool.name),
                       role=PREFILL_ROLE, config_key=PREFILL_CONFIG_KEY)  # fmt: skip
    sts["metadata"]["labels"] |= role_labels(PREFILL_ROLE)  # the mirror tells the tiers apart
    return sts


def _statefulset(
    pool: PoolRef, spec: GenPoolSpec, image: str, *, name: str, role: str | None, config_key: str
) -> dict[str, Any]:
    labels = pool_labels(pool.name) | role_labels(role)
    refs = PodRefs(
        labels=labels,
        config_hash=config_hash(spec),
        configmap_name=configmap_name(pool.name),
        admin_secret_name=admin_secret_name(pool.name),
        kv_secret_name=kv_secret_name(pool.name),
        config_key=config_key,
        role=role,
    )
    # The GEN tier keeps the pool label alone (as before P/D); the prefill tier's own
    # selector adds its role, so neither StatefulSet claims the other's pods.
    selector = pool_selector(pool.name) | (role_labels(role) if role == PREFILL_ROLE else {})
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(pool, name),
        "spec": {
            "replicas": spec.replicas,
            "serviceName": headless_service_name(pool.name),
            # Workers are independent: start and stop them all at once.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector},
            "updateStrategy": {"type": "RollingUpdate"},
            "revisionHistoryLimit": 5,
            "template": build_pod_template(spec, image, refs),
        },
    }


def resolve_image(spec: GenPoolSpec, image_default: str) -> str:
    image = spec.image or image_default
    if not image:
        raise ValueError("no worker image: set spec.image or the operator's GENPOOL_WORKER_IMAGE")
    return image


def build_children(
    pool: PoolRef, spec: GenPoolSpec, *, image_default: str, admin_token: str | None
) -> list[dict[str, Any]]:
    """Every child, in apply order: what the pods reference comes before the StatefulSet.

    Without an admin token (an operator run without GENPOOL_ADMIN_TOKEN) there is no
    Secret; the pods' secretKeyRef and KV secret volume are optional, so their admin
    endpoints and KV pulls are as open as the operator's calls to them are
    unauthenticated.
    """
    secret = (
        [build_admin_secret(pool, admin_token),
         build_kv_secret(pool, admin_token, _metadata(pool, kv_secret_name(pool.name)))]
        if admin_token else []
    )  # fmt: skip
    image = resolve_image(spec, image_default)
    prefill = [build_prefill_statefulset(pool, spec, image)] if spec.prefill else []
    return [
        *secret,
        build_configmap(pool, spec),
        build_headless_service(pool),
        build_service(pool, spec),
        build_pdb(pool),
        build_statefulset(pool, spec, image),
        *prefill,
    ]
