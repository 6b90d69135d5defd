"""The prefill tier's children (``spec.prefill``, docs/pd.md): the two StatefulSets, their
roles, labels, args and worker.json, what selects which pods, and a failing prefill pod's
Degraded. The golden file of a P/D pool is ``golden/pd.yaml`` (test_builders.py); the spec
is test_prefill_spec.py, the stats round's half test_prefill_round.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from genpool_core.names import POOL_LABEL
from genpool_operator.builders import PoolRef, build_children, build_prefill_statefulset
from genpool_operator.inference_pool import build_inference_pool
from genpool_operator.pod_failures import degraded_condition, pool_failures
from genpool_operator.spec import GenPoolSpec
from genpool_operator.tiers import (
    ROLE_LABEL,
    gen_pods_selector,
    is_prefill,
    role_of,
    split_tiers,
    status_selector,
)

POOL = PoolRef("chat", "serving", "uid-chat", 3)
PD: dict[str, Any] = {
    "replicas": 2,
    "model": "synthetic:tiny",
    "accelerator": "none",
    "resources": {"requests": {"cpu": "1"}},
    "preemption": {"mode": "TargetOutputTps", "targetOutputTps": 8},
    "inferencePool": {"enabled": True, "endpointPickerRef": {"name": "epp", "port": 9002}},
    "prefill": {"replicas": 3},
}


def children(spec: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    built = build_children(POOL, GenPoolSpec.from_body(spec), image_default="w:1", admin_token="t")
    return {(c["kind"], c["metadata"]["name"]): c for c in built}


def pod_labels(sts: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = sts["spec"]["template"]["metadata"]["labels"]
    return labels


def container(sts: dict[str, Any]) -> dict[str, Any]:
    (found,) = sts["spec"]["template"]["spec"]["containers"]
    result: dict[str, Any] = found
    return result


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


# ---- the children --------------------------------------------------------------------------


def test_a_pd_pool_has_two_statefulsets_with_roles_labels_and_args() -> None:
    built = children(PD)
    gen, prefill = built["StatefulSet", "chat-worker"], built["StatefulSet", "chat-prefill"]
    assert (gen["spec"]["replicas"], prefill["spec"]["replicas"]) == (2, 3)
    assert pod_labels(gen)[ROLE_LABEL] == "decode" and pod_labels(prefill)[ROLE_LABEL] == "prefill"
    assert pod_labels(gen)[POOL_LABEL] == pod_labels(prefill)[POOL_LABEL] == "chat"
    assert container(gen)["args"][-1] == "--role=decode"
    assert container(prefill)["args"][-1] == "--role=prefill"
    assert container(gen)["image"] == container(prefill)["image"] == "w:1"
    assert container(gen)["command"] == container(prefill)["command"]
    assert prefill["metadata"]["ownerReferences"] == gen["metadata"]["ownerReferences"]
    assert prefill["spec"]["serviceName"] == gen["spec"]["serviceName"]


def test_every_child_is_owned_and_labelled_and_only_the_prefill_statefulset_has_a_role() -> None:
    built = build_children(POOL, GenPoolSpec.from_body(PD), image_default="w:1", admin_token="t")
    assert [(c["kind"], c["metadata"]["name"]) for c in built] == [
        ("Secret", "chat-worker-admin"), ("Secret", "chat-kv-secret"),
        ("ConfigMap", "chat-worker-config"),
        ("Service", "chat-worker-headless"), ("Service", "chat-worker"),
        ("PodDisruptionBudget", "chat-worker"), ("StatefulSet", "chat-worker"),
        ("StatefulSet", "chat-prefill"),
    ]  # fmt: skip
    for child in built:
        meta = child["metadata"]
        assert meta["labels"][POOL_LABEL] == "chat" and meta["namespace"] == "serving"
        assert [o["uid"] for o in meta["ownerReferences"]] == ["uid-chat"]
    # The StatefulSet mirror tells the tiers apart by this label on the StatefulSet itself.
    assert [c["metadata"]["name"] for c in built if is_prefill(c)] == ["chat-prefill"]


def test_no_prefill_statefulset_without_spec_prefill() -> None:
    with pytest.raises(ValueError, match=r"spec\.prefill is not set"):
        build_prefill_statefulset(POOL, GenPoolSpec.from_body({}), "w:1")


def test_neither_statefulset_selects_the_other_tiers_pods() -> None:
    built = children(PD)
    gen, prefill = built["StatefulSet", "chat-worker"], built["StatefulSet", "chat-prefill"]
    # The GEN selector is the pool label alone (immutable, as before P/D): it also matches
    # the prefill pods, which the StatefulSet controller leaves to their own owner.
    assert gen["spec"]["selector"]["matchLabels"] == {POOL_LABEL: "chat"}
    assert not selects(prefill["spec"]["selector"]["matchLabels"], pod_labels(gen))
    assert selects(prefill["spec"]["selector"]["matchLabels"], pod_labels(prefill))


def test_the_tiers_have_their_own_worker_json() -> None:
    built = children(PD)
    data = built["ConfigMap", "chat-worker-config"]["data"]
    gen, prefill = json.loads(data["worker.json"]), json.loads(data["prefill.json"])
    assert gen["preemption_mode"] == "target_output_tps" and prefill["preemption_mode"] == "off"
    assert {k: gen[k] for k in ("model", "max_seq_len", "kv_block_size", "device")} == {
        k: prefill[k] for k in ("model", "max_seq_len", "kv_block_size", "device")
    }
    keys = [
        var["valueFrom"]["configMapKeyRef"]["key"]
        for sts in (built["StatefulSet", "chat-worker"], built["StatefulSet", "chat-prefill"])
        for var in container(sts)["env"]
        if var["name"] == "GENPOOL_WORKER_CONFIG"
    ]
    assert keys == ["worker.json", "prefill.json"]


def test_the_prefill_replicas_roll_no_pods_and_its_resources_only_its_own() -> None:
    def templates(prefill: dict[str, Any]) -> tuple[Any, Any]:
        built = children({**PD, "prefill": prefill})
        gen, tier = built["StatefulSet", "chat-worker"], built["StatefulSet", "chat-prefill"]
        return gen["spec"]["template"], tier["spec"]["template"]

    assert templates({"replicas": 1}) == templates({"replicas": 5})
    gen, tier = templates({})
    gen_after, tier_after = templates({"resources": {"limits": {"memory": "8Gi"}}})
    assert gen_after == gen and tier_after != tier
    assert container({"spec": {"template": tier_after}})["resources"] == {
        "limits": {"memory": "8Gi"}
    }


def test_clients_reach_the_decode_tier_and_the_inference_pool_both_tiers() -> None:
    built = children(PD)
    gen, prefill = built["StatefulSet", "chat-worker"], built["StatefulSet", "chat-prefill"]
    service = built["Service", "chat-worker"]["spec"]["selector"]
    assert selects(service, pod_labels(gen)) and not selects(service, pod_labels(prefill))
    headless = built["Service", "chat-worker-headless"]["spec"]["selector"]
    pdb = built["PodDisruptionBudget", "chat-worker"]["spec"]["selector"]["matchLabels"]
    routed = build_inference_pool(POOL, GenPoolSpec.from_body(PD).inference_pool)
    for selector in (headless, pdb, routed["spec"]["selector"]["matchLabels"]):
        assert selects(selector, pod_labels(gen)) and selects(selector, pod_labels(prefill))


def test_without_a_prefill_tier_no_role_anywhere() -> None:
    built = children({k: v for k, v in PD.items() if k != "prefill"})
    assert ("StatefulSet", "chat-prefill") not in built
    gen = built["StatefulSet", "chat-worker"]
    assert ROLE_LABEL not in pod_labels(gen) and not any(
        arg.startswith("--role") for arg in container(gen)["args"]
    )
    assert "prefill.json" not in built["ConfigMap", "chat-worker-config"]["data"]
    assert built["Service", "chat-worker"]["spec"]["selector"] == {POOL_LABEL: "chat"}


# ---- which pods are which ------------------------------------------------------------------


def pod(name: str, role: str | None, ip: str = "10.0.0.1") -> dict[str, Any]:
    labels = {POOL_LABEL: "chat", **({ROLE_LABEL: role} if role else {})}
    return {"metadata": {"name": name, "labels": labels}, "status": {"podIP": ip}}


def test_pods_split_into_tiers_and_a_pod_without_a_role_is_gen() -> None:
    pods = [pod("a", "decode"), pod("b", "prefill"), pod("c", None), pod("d", "other")]
    gen, prefill = split_tiers(pods)
    assert [p["metadata"]["name"] for p in gen] == ["a", "c", "d"]
    assert [p["metadata"]["name"] for p in prefill] == ["b"]
    assert role_of(pods[1]) == "prefill" and role_of({}) is None


def test_the_scale_selector_leaves_the_prefill_pods_out_only_in_a_pd_pool() -> None:
    assert gen_pods_selector("chat", is_disaggregated=False) == "genpool.dev/pool=chat"
    assert gen_pods_selector("chat", is_disaggregated=True) == (
        "genpool.dev/pool=chat,llm-d.ai/role!=prefill"
    )


def test_an_invalid_spec_keeps_the_recorded_selector() -> None:
    pd = "genpool.dev/pool=chat,llm-d.ai/role!=prefill"
    assert status_selector("chat", is_disaggregated=None, recorded=pd) == pd
    assert status_selector("chat", is_disaggregated=None, recorded=None) == "genpool.dev/pool=chat"
    assert status_selector("chat", is_disaggregated=False, recorded=pd) == "genpool.dev/pool=chat"
    assert status_selector("chat", is_disaggregated=True, recorded=None) == pd


def test_a_crash_looping_prefill_pod_degrades_the_pool_naming_it() -> None:
    crashing = pod("chat-prefill-0", "prefill")
    crashing["status"]["containerStatuses"] = [{
        "name": "worker", "ready": False, "restartCount": 3,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 2, "message": "KV layout mismatch\nmore"}},
    }]  # fmt: skip
    healthy = pod("chat-worker-0", "decode")
    condition = degraded_condition(None, pool_failures([healthy, crashing]))
    assert (condition.status, condition.reason) == (True, "WorkerCrashLoop")
    assert condition.message == "pod chat-prefill-0: KV layout mismatch"
