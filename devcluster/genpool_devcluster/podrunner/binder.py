"""The scheduler's part: bind pending pods to this one node through pods/{name}/binding.

Checks only what can make a pod unfit for this node: nodeSelector and required node affinity.
Resource requests are not counted (one dev node; GPUs are advertised, not allocated).
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from .kube import ApiError, Kube, pod_path

log = logging.getLogger(__name__)
Obj = dict[str, Any]
OUR_SCHEDULERS = ("", "default-scheduler")


def _expr_ok(expr: Obj, values: dict[str, str]) -> bool:
    key, op, want = expr["key"], expr["operator"], expr.get("values") or []
    have = values.get(key)
    if op == "In":
        return have in want
    if op == "NotIn":
        return have not in want
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and have.lstrip("-").isdigit():
        return int(have) > int(want[0]) if op == "Gt" else int(have) < int(want[0])
    return False


def unfit_reason(pod: Obj, node_name: str, labels: dict[str, str]) -> str:
    """Why the pod cannot go on this node ("" when it can)."""
    spec = pod["spec"]
    wrong = {k: v for k, v in (spec.get("nodeSelector") or {}).items() if labels.get(k) != v}
    if wrong:
        return f"0/1 nodes are available: node(s) didn't match Pod's node selector {wrong}."
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    fields = {"metadata.name": node_name}
    if terms and not any(
        all(_expr_ok(e, labels) for e in t.get("matchExpressions") or [])
        and all(_expr_ok(e, fields) for e in t.get("matchFields") or [])
        for t in terms
    ):
        return "0/1 nodes are available: node(s) didn't match Pod's node affinity/selector."
    return ""


class Binder:
    def __init__(self, kube: Kube, node_name: str, labels: dict[str, str]) -> None:
        self.kube, self.node, self.labels = kube, node_name, labels
        self.retry: dict[str, Obj] = {}  # uid -> pod whose binding failed for a passing reason
        self.unfit: set[str] = set()  # uids already marked Unschedulable

    @staticmethod
    def wants(pod: Obj) -> bool:
        spec, meta = pod["spec"], pod["metadata"]
        return (
            not spec.get("nodeName")
            and not meta.get("deletionTimestamp")
            and (spec.get("schedulerName") or "") in OUR_SCHEDULERS
            and not spec.get("schedulingGates")
            and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        )

    def offer(self, pod: Obj) -> None:
        uid = pod["metadata"]["uid"]
        self.retry.pop(uid, None)
        if not self.wants(pod):
            return
        reason = unfit_reason(pod, self.node, self.labels)
        if reason:
            self._mark_unschedulable(pod, reason)
            return
        try:
            self._bind(pod)
        except (ApiError, httpx.HTTPError) as err:
            if not (isinstance(err, ApiError) and err.status in (404, 409)):
                log.warning("binding %s failed (%s); will retry", pod["metadata"]["name"], err)
                self.retry[uid] = pod

    def forget(self, uid: str) -> None:
        self.retry.pop(uid, None)
        self.unfit.discard(uid)

    def retry_failed(self) -> None:
        for pod in list(self.retry.values()):
            self.offer(pod)

    def _bind(self, pod: Obj) -> None:
        meta = pod["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node},
        }
        self.kube.post(pod_path(meta["namespace"], meta["name"], "binding"), body)
        log.info("bound %s/%s to %s", meta["namespace"], meta["name"], self.node)

    def _mark_unschedulable(self, pod: Obj, reason: str) -> None:
        meta = pod["metadata"]
        if meta["uid"] in self.unfit:
            return
        self.unfit.add(meta["uid"])
        cond = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": reason,
        }
        try:
            self.kube.merge_patch(
                pod_path(meta["namespace"], meta["name"], "status"),
                {"status": {"conditions": [cond]}},
            )
        except (ApiError, httpx.HTTPError) as err:
            log.warning("marking %s unschedulable: %s", meta["name"], err)
