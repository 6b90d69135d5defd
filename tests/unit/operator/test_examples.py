"""The autoscaling examples: the autoscaled GenPool is valid, and the HPA example is a
valid HorizontalPodAutoscaler on a pool without autoscaling, reading a metric the
operator exports."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import yaml

from genpool_core.names import API_KIND, GROUP_VERSION
from genpool_operator import metrics
from genpool_operator.spec import GenPoolSpec

EXAMPLES = Path(__file__).parents[3] / "examples"


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
