"""The two tiers of a P/D pool (``spec.prefill``, docs/pd.md): the role label, the names
of the prefill tier's children, and which pods belong to which tier. Pure.

A P/D pool's GEN pods run ``--role=decode`` and carry ``llm-d.ai/role: decode``; its
prefill pods (StatefulSet ``<pool>-prefill``) run ``--role=prefill`` and carry
``llm-d.ai/role: prefill``, the label llm-d's P/D picker selects prefill pods by. Both
tiers carry the pool label, so the InferencePool, the headless Service and the
PodDisruptionBudget cover both; the stats round, the ClusterIP Service and the scale
subresource's selector only the GEN tier. A pool without ``spec.prefill`` has one tier
and no role label (its pods run the worker's default, ``--role`` both).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from genpool_core.names import DECODE_ROLE, PREFILL_ROLE, ROLE_LABEL, pool_label_selector

# The prefill workers' worker.json, a second key of the pool's ConfigMap.
PREFILL_CONFIG_KEY = "prefill.json"


def prefill_statefulset_name(pool: str) -> str:
    return f"{pool}-prefill"


def role_of(obj: Mapping[str, Any]) -> str | None:
    """The ``llm-d.ai/role`` label of an object (a pod, a StatefulSet), or None."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    role = labels.get(ROLE_LABEL)
    return role if isinstance(role, str) else None


def is_prefill(obj: Mapping[str, Any]) -> bool:
    return role_of(obj) == PREFILL_ROLE


def split_tiers(
    pods: Iterable[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A pool's pods as (GEN pods, prefill pods); a pod without a role is a GEN pod."""
    gen: list[dict[str, Any]] = []
    prefill: list[dict[str, Any]] = []
    for pod in pods:
        (prefill if is_prefill(pod) else gen).append(pod)
    return gen, prefill


def gen_pods_selector(pool: str, *, is_disaggregated: bool) -> str:
    """The GEN tier's pods as a label selector (``status.selector``, which the scale
    subresource and an HPA read): the pool's pods, less the prefill tier's."""
    base = pool_label_selector(pool)
    return f"{base},{ROLE_LABEL}!={PREFILL_ROLE}" if is_disaggregated else base


def status_selector(pool: str, *, is_disaggregated: bool | None, recorded: object) -> str:
    """``status.selector`` after a reconcile. ``is_disaggregated`` None: the spec is
    invalid and the children stay as they are, so the selector recorded stands."""
    if is_disaggregated is None and isinstance(recorded, str):
        return recorded
    return gen_pods_selector(pool, is_disaggregated=bool(is_disaggregated))


def role_labels(role: str | None) -> dict[str, str]:
    """The role label of a tier's pods ({} for a pool without a prefill tier)."""
    return {ROLE_LABEL: role} if role else {}


def gen_role(is_disaggregated: bool) -> str | None:
    """The GEN tier's role: decode beside a prefill tier, else none (the worker's both)."""
    return DECODE_ROLE if is_disaggregated else None
