"""Child builders: golden files, schema validity, idempotence, what rolls the pods.

Regenerate the goldens after an intended change: GENPOOL_UPDATE_GOLDEN=1 pytest this file.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from genpool_core.names import CONFIG_HASH_ANNOTATION, pool_label_selector
from genpool_operator.builders import (
    PoolRef,
    build_children,
    config_hash,
    resolve_image,
)
from genpool_operator.spec import GenPoolSpec
from genpool_operator.spec_sections import EnvVar, PodTemplate

GOLDEN = Path(__file__).parent / "golden"
EXAMPLES = Path(__file__).parents[3] / "examples"
KUBE_VERSION = kubernetes_validate.latest_version()
IMAGE = "registry.example/genpool-worker:0.1.0"
TOKEN = "pool-admin-token"

POOLS: dict[str, dict[str, Any]] = {
    "gpu-tp2": {
        "replicas": 3,
        "model": "smollm2-135m",
        "accelerator": "nvidia",
        "tensorParallelSize": 2,
        "resources": {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"memory": "16Gi"}},
        "engine": {"maxBatchSize": 32, "maxNumActiveRequests": 48},
        "preemption": {"mode": "TargetOutputTps", "targetOutputTps": 18.5},
        "tuning": {"residentHeadroom": {"max": 24}, "pausedCap": {"min": 2, "max": 20}},
    },
    "cpu-off": {
        "replicas": 2,
        "image": "genpool-worker:dev",
        "model": "synthetic:demo",
        "accelerator": "none",
        "resources": {"requests": {"cpu": 1, "memory": "1Gi"}},
        "drain": {"timeoutSeconds": 30},
    },
    "cpu-limit": {  # the KV budget derived from the memory limit (kv_budget's rule 4)
        "model": "smollm2-135m",
        "accelerator": "none",
        "resources": {"requests": {"cpu": "2", "memory": "3Gi"}, "limits": {"memory": "3Gi"}},
        "engine": {"kvBlockSize": 32},
    },
    "kv-events": {  # KV events for llm-d's precise prefix-cache scorer: an arg and a port
        "model": "smollm2-135m",
        "accelerator": "none",
        "preemption": {"mode": "TargetOutputTps", "targetOutputTps": 8},
        "engine": {"kvEvents": {"enabled": True}},
    },
    "pd": {  # a prefill tier beside the GEN tier (docs/pd.md), its memory limit its own
        "replicas": 2,
        "model": "smollm2-135m",
        "accelerator": "none",
        "resources": {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"memory": "2Gi"}},
        "preemption": {"mode": "TargetOutputTps", "targetOutputTps": 8},
        "prefill": {"replicas": 1, "resources": {"limits": {"memory": "3Gi"}}},
    },
    "pod-template": {
        "accelerator": "none",
        "preemption": {"mode": "TpotBudget", "tpotBudget": 0.2},
        "podTemplate": {
            "labels": {"team": "search", "genpool.dev/pool": "not-mine"},
            "annotations": {"prometheus.io/scrape": "true", CONFIG_HASH_ANNOTATION: "forged"},
            "nodeSelector": {"pool": "decode"},
            "tolerations": [{"key": "decode", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 100,
                            "podAffinityTerm": {
                                "topologyKey": "kubernetes.io/hostname",
                                "labelSelector": {"matchLabels": {"genpool.dev/pool": "tmpl"}},
                            },
                        }
                    ]
                }
            },
            "priorityClassName": "decode-high",
            "env": [
                {"name": "HF_HUB_OFFLINE", "value": "1"},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            ],
        },
    },
}


def pool_ref(name: str) -> PoolRef:
    return PoolRef(name=name, namespace="decode", uid=f"uid-{name}", generation=4)


def children_of(name: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    return build_children(
        pool_ref(name), GenPoolSpec.from_body(spec), image_default=IMAGE, admin_token=TOKEN
    )


def by_kind(children: list[dict[str, Any]], kind: str, name: str = "") -> dict[str, Any]:
    return next(c for c in children if c["kind"] == kind and c["metadata"]["name"].endswith(name))


@pytest.mark.parametrize("name", sorted(POOLS))
def test_children_match_the_golden_file(name: str) -> None:
    children = children_of(name, POOLS[name])
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("GENPOOL_UPDATE_GOLDEN") == "1":
        path.write_text(yaml.safe_dump_all(children, sort_keys=False, width=100))
    assert list(yaml.safe_load_all(path.read_text())) == children


@pytest.mark.parametrize("name", sorted(POOLS))
def test_every_child_is_a_valid_kubernetes_object(name: str) -> None:
    for child in children_of(name, POOLS[name]):
        kubernetes_validate.validate(child, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("genpool-*.yaml")), ids=lambda p: p.name)
def test_examples_build_valid_children(path: Path) -> None:
    body = yaml.safe_load(path.read_text())
    assert body["apiVersion"] == "genpool.dev/v1alpha1" and body["kind"] == "GenPool"
    for child in children_of(body["metadata"]["name"], body["spec"]):
        kubernetes_validate.validate(child, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("name", sorted(POOLS))
def test_same_input_same_children(name: str) -> None:
    assert children_of(name, POOLS[name]) == children_of(name, POOLS[name])
    spec = GenPoolSpec.from_body(POOLS[name])
    again = GenPoolSpec.from_body(spec.model_dump(by_alias=True, exclude_none=True))
    assert config_hash(again) == config_hash(spec)


def test_labels_owner_and_selector_on_every_child() -> None:
    children = children_of("pool-a", POOLS["cpu-off"])
    assert [c["kind"] for c in children] == [
        "Secret", "Secret", "ConfigMap", "Service", "Service", "PodDisruptionBudget", "StatefulSet",
    ]  # fmt: skip
    for child in children:
        meta = child["metadata"]
        assert meta["namespace"] == "decode"
        assert meta["labels"]["genpool.dev/pool"] == "pool-a"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "genpool-operator"
        (owner,) = meta["ownerReferences"]
        assert owner == {
            "apiVersion": "genpool.dev/v1alpha1", "kind": "GenPool", "name": "pool-a",
            "uid": "uid-pool-a", "controller": True, "blockOwnerDeletion": True,
        }  # fmt: skip
    sts = by_kind(children, "StatefulSet")
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pool_label_selector("pool-a") == "genpool.dev/pool=pool-a"
    secret = by_kind(children, "Secret")
    assert base64.b64decode(secret["data"]["token"]).decode() == TOKEN


def test_no_admin_token_no_secret() -> None:
    spec = GenPoolSpec.from_body(POOLS["cpu-off"])
    children = build_children(pool_ref("p"), spec, image_default=IMAGE, admin_token=None)
    assert "Secret" not in {c["kind"] for c in children}


def test_gpu_pool_asks_for_one_gpu_per_rank() -> None:
    sts = by_kind(children_of("g", POOLS["gpu-tp2"]), "StatefulSet")
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container["resources"]["requests"]["nvidia.com/gpu"] == 2
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]


def test_cpu_pool_has_no_gpu_and_runs_on_cpu() -> None:
    children = children_of("c", POOLS["cpu-off"])
    (container,) = by_kind(children, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in json.dumps(container)
    worker = json.loads(by_kind(children, "ConfigMap")["data"]["worker.json"])
    assert worker["device"] == "cpu" and worker["preemption_mode"] == "off"
    assert container["image"] == "genpool-worker:dev"


def test_a_claim_model_volume_mounts_read_only_and_the_worker_loads_from_it() -> None:
    spec = {
        "model": "Llama-3.1-8B-Instruct",
        "modelVolume": {"persistentVolumeClaim": {"claimName": "ckpt"}, "subPath": "meta"},
    }
    children = children_of("v", spec)
    pod = by_kind(children, "StatefulSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {
        "name": "model", "persistentVolumeClaim": {"claimName": "ckpt", "readOnly": True},
    } in pod["volumes"]  # fmt: skip
    assert {
        "name": "model", "mountPath": "/models", "readOnly": True, "subPath": "meta",
    } in container["volumeMounts"]  # fmt: skip
    worker = json.loads(by_kind(children, "ConfigMap")["data"]["worker.json"])
    assert worker["model"] == "/models/Llama-3.1-8B-Instruct"


def test_a_host_path_model_volume_serves_its_root_as_dot() -> None:
    spec = {"model": ".", "modelVolume": {"hostPath": {"path": "/data/llama"}}}
    children = children_of("h", spec)
    pod = by_kind(children, "StatefulSet")["spec"]["template"]["spec"]
    assert {"name": "model", "hostPath": {"path": "/data/llama", "type": "Directory"}} in pod[
        "volumes"
    ]
    (container,) = pod["containers"]
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in container["volumeMounts"]
    worker = json.loads(by_kind(children, "ConfigMap")["data"]["worker.json"])
    assert worker["model"] == "/models"


def test_without_a_model_volume_the_model_passes_through_unmounted() -> None:
    children = children_of("g", POOLS["gpu-tp2"])
    pod = by_kind(children, "StatefulSet")["spec"]["template"]["spec"]
    assert "model" not in {volume["name"] for volume in pod["volumes"]}
    worker = json.loads(by_kind(children, "ConfigMap")["data"]["worker.json"])
    assert worker["model"] == "smollm2-135m"


def test_the_gpu_examples_ask_for_one_gpu_per_rank_and_mount_their_model() -> None:
    for path, num_gpus in (("genpool-gpu.yaml", 1), ("genpool-gpu-70b.yaml", 8)):
        body = yaml.safe_load((EXAMPLES / path).read_text())
        children = children_of(body["metadata"]["name"], body["spec"])
        (container,) = by_kind(children, "StatefulSet")["spec"]["template"]["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == num_gpus, path
        worker = json.loads(by_kind(children, "ConfigMap")["data"]["worker.json"])
        assert worker["model"].startswith("/models/Llama-3.1-"), path


def test_pod_template_merge_keeps_ours() -> None:
    sts = by_kind(children_of("tmpl", POOLS["pod-template"]), "StatefulSet")
    meta, pod = sts["spec"]["template"]["metadata"], sts["spec"]["template"]["spec"]
    assert meta["labels"]["genpool.dev/pool"] == "tmpl" and meta["labels"]["team"] == "search"
    assert meta["annotations"][CONFIG_HASH_ANNOTATION] != "forged"
    assert meta["annotations"]["prometheus.io/scrape"] == "true"
    assert pod["nodeSelector"] == {"pool": "decode"} and pod["priorityClassName"] == "decode-high"
    env = [var["name"] for var in pod["containers"][0]["env"]]
    assert env[-2:] == ["HF_HUB_OFFLINE", "NODE"] and env[0] == "POD_IP"


def test_user_env_never_replaces_ours() -> None:
    # The spec model refuses such env; the builder still drops it if one gets through.
    spec = GenPoolSpec.from_body(POOLS["cpu-off"])
    forged = PodTemplate.model_construct(env=[EnvVar.model_construct(name="POD_IP", value="x")])
    spec = spec.model_copy(update={"pod_template": forged})
    (container,) = by_kind(
        build_children(pool_ref("p"), spec, image_default=IMAGE, admin_token=TOKEN), "StatefulSet"
    )["spec"]["template"]["spec"]["containers"]
    assert [v for v in container["env"] if v["name"] == "POD_IP"] == [
        {
            "name": "POD_IP",
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}},
        }
    ]


def test_drain_timeout_sets_the_grace_period() -> None:
    sts = by_kind(children_of("c", POOLS["cpu-off"]), "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 35
    (container,) = pod["containers"]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["genpool-worker-drain"]
    assert {"name": "GENPOOL_DRAIN_TIMEOUT_S", "value": "30"} in container["env"]


def with_change(base: dict[str, Any], section: str, **fields: Any) -> dict[str, Any]:
    changed = json.loads(json.dumps(base))
    target = changed.setdefault(section, {}) if section else changed
    target.update(fields)
    return changed


TEMPLATE_CHANGES = [
    ("", {"model": "synthetic:other"}),
    ("", {"tensorParallelSize": 4}),
    ("engine", {"maxBatchSize": 64}),
    ("engine", {"maxSeqLen": 4096}),
    ("preemption", {"targetOutputTps": 30}),
    ("tuning", {"intervalSeconds": 10}),
    ("tuning", {"residentHeadroom": {"max": 30}}),
    ("engine", {"kvBlockSize": 32}),
    ("engine", {"gpuMemoryUtilization": 0.8}),
    ("engine", {"kvCacheMemory": "20Gi"}),
]
LIVE_CHANGES = [
    ("", {"replicas": 7}),
    ("preemption", {"slackSeconds": 2.0}),
    ("preemption", {"admissionTargetSeconds": {"min": 1, "max": 5}}),
    ("tuning", {"pausedCap": {"min": 4, "max": 12}}),
    ("tuning", {"cooldownIntervals": 5, "enabled": False}),
]


@pytest.mark.parametrize(("section", "fields"), TEMPLATE_CHANGES)
def test_template_fields_change_the_config_hash(section: str, fields: dict[str, Any]) -> None:
    base = POOLS["gpu-tp2"]
    before = config_hash(GenPoolSpec.from_body(base))
    assert config_hash(GenPoolSpec.from_body(with_change(base, section, **fields))) != before


def test_a_cpu_memory_limit_changes_the_kv_budget_and_the_config_hash() -> None:
    base = POOLS["cpu-limit"]
    bigger = with_change(base, "resources", limits={"memory": "4Gi"})
    budgets = [GenPoolSpec.from_body(s).worker_config()["kv_cache_memory"] for s in (base, bigger)]
    assert budgets[1] - budgets[0] == 1 << 30
    assert config_hash(GenPoolSpec.from_body(bigger)) != config_hash(GenPoolSpec.from_body(base))


@pytest.mark.parametrize(("section", "fields"), LIVE_CHANGES)
def test_live_fields_keep_the_config_hash(section: str, fields: dict[str, Any]) -> None:
    base = POOLS["gpu-tp2"]
    changed = GenPoolSpec.from_body(with_change(base, section, **fields))
    assert config_hash(changed) == config_hash(GenPoolSpec.from_body(base))


def test_an_image_is_required() -> None:
    with pytest.raises(ValueError, match="no worker image"):
        resolve_image(GenPoolSpec.from_body({}), "")
    assert resolve_image(GenPoolSpec.from_body({"image": "mine:1"}), IMAGE) == "mine:1"
