"""The operator's series for one pool go when the pool does; other pools' stay."""

from __future__ import annotations

from prometheus_client import REGISTRY

from genpool_operator import metrics


def _desired(namespace: str, pool: str) -> float | None:
    labels = {"namespace": namespace, "pool": pool}
    return REGISTRY.get_sample_value("genpool_operator_desired_replicas", labels)


def _decisions(namespace: str, pool: str, reason: str) -> float | None:
    labels = {"namespace": namespace, "pool": pool, "kind": "replicas", "reason": reason,
              "advisory": "false"}  # fmt: skip
    return REGISTRY.get_sample_value("genpool_operator_decisions_total", labels)


def test_forgetting_a_deleted_pool_drops_its_series_and_keeps_the_others() -> None:
    for pool in ("gone", "kept"):
        metrics.DESIRED_REPLICAS.labels("ns", pool).set(3)
        metrics._count_decision(("ns", pool, "replicas", "up-tail", "false"))
        metrics.ROUND_SECONDS.labels("ns", pool).observe(0.1)
    metrics.forget_pool("ns", "gone")
    assert _desired("ns", "gone") is None
    assert _decisions("ns", "gone", "up-tail") is None
    assert _desired("ns", "kept") == 3
    assert _decisions("ns", "kept", "up-tail") == 1
    metrics.forget_pool("ns", "never-seen")  # nothing written: nothing to drop, no error
    metrics.forget_pool("ns", "kept")
