"""The examples: every GenPool passes the operator's checks and gets a KV budget that
holds one request of its maxSeqLen; the autoscaled GenPool is valid, and the HPA example
is a valid HorizontalPodAutoscaler on a pool without autoscaling, reading a metric the
operator exports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from genpool_core.model_catalogue import known_shape
from genpool_core.names import API_KIND, GROUP_VERSION
from genpool_operator import metrics
from genpool_operator.kv_budget import FLOAT32_BYTES
from genpool_operator.spec import GenPoolSpec
from genpool_operator.spec_check import checked_spec

EXAMPLES = Path(__file__).parents[3] / "examples"
GENPOOLS = sorted(
    path for path in EXAMPLES.glob("*.yaml") if yaml.safe_load(path.read_text())["kind"] == API_KIND
)


def example_spec(path: Path) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(path.read_text())["spec"]
    return spec


def test_the_examples_hold_genpools() -> None:
    assert len(GENPOOLS) >= 5


@pytest.mark.parametrize("path", GENPOOLS, ids=lambda path: path.name)
def test_every_example_passes_the_operators_checks(path: Path) -> None:
    spec = checked_spec(example_spec(path))
    config = spec.worker_config()
    if spec.accelerator == "nvidia":  # the worker sizes the KV cache from the GPU share
        assert config["gpu_memory_utilization"] == 0.9 and "kv_cache_memory" not in config


CPU_WITH_LIMIT = [
    path
    for path in GENPOOLS
    if example_spec(path).get("accelerator") == "none"
    and "memory" in example_spec(path).get("resources", {}).get("limits", {})
]


@pytest.mark.parametrize("path", CPU_WITH_LIMIT, ids=lambda path: path.name)
def test_a_cpu_example_with_a_memory_limit_holds_one_request(path: Path) -> None:
    spec = checked_spec(example_spec(path))
    shape = known_shape(spec.model)
    assert shape is not None, "an example's model is one the operator can size"
    per_rank = spec.worker_config()["kv_cache_memory"]
    ranks, block = spec.tensor_parallel_size, spec.engine.kv_block_size
    block_bytes = shape.kv_bytes_per_token(FLOAT32_BYTES) * block // ranks
    assert (per_rank // block_bytes) * block >= spec.engine.max_seq_len


def test_the_cpu_example_leaves_403_mib_of_its_2_gib() -> None:
    assert len(CPU_WITH_LIMIT) >= 3
    spec = checked_spec(example_spec(EXAMPLES / "genpool-cpu.yaml"))
    assert spec.worker_config()["kv_cache_memory"] == 422_435_584  # 571 blocks of 16 and the dummy


def test_the_autoscaled_example_is_a_valid_autoscaled_pool() -> None:
    pool = yaml.safe_load((EXAMPLES / "genpool-autoscaled.yaml").read_text())
    spec = GenPoolSpec.from_body(pool["spec"])
    assert spec.autoscaling.enabled and spec.slo is not None and not spec.advisory


def test_the_hpa_example_drives_a_manual_pool_from_an_operator_metric() -> None:
    hpa = yaml.safe_load((EXAMPLES / "hpa-genpool.yaml").read_text())
    kubernetes_validate.validate(hpa, kubernetes_validate.latest_version(), strict=True)
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"]) == (GROUP_VERSION, API_KIND)
    pools = {
        doc["metadata"]["name"]: doc
        for path in EXAMPLES.glob("genpool-*.yaml")
        if (doc := yaml.safe_load(path.read_text()))["kind"] == API_KIND
    }
    assert not GenPoolSpec.from_body(pools[target["name"]]["spec"]).autoscaling.enabled
    (metric,) = hpa["spec"]["metrics"]
    (family,) = metrics.SLO_TTFT_P90.describe()
    assert metric["external"]["metric"]["name"] == family.name
    assert metric["external"]["metric"]["selector"]["matchLabels"] == {"pool": target["name"]}
