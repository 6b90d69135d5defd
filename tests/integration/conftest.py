"""Fixtures for the integration tests: namespaces for the pod runner's, GIE's CRDs for the
picker's (the cluster, the GenPool CRD and the operator process live in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from tests.conftest import Kubectl
from tests.integration.inference_pool_harness import (
    install_inference_objective_crd,
    install_inference_pool_crd,
    remove_inference_objective_crd,
    remove_inference_pool_crd,
)
from tests.polling import wait_for


@pytest.fixture
def core(kube_api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(kube_api)


@pytest.fixture
def ns(core: client.CoreV1Api, namespace: str) -> str:
    """The test namespace once its `default` ServiceAccount exists (admission needs it)."""
    wait_for(
        lambda: core.read_namespaced_service_account("default", namespace),
        "the default ServiceAccount",
    )
    return namespace


@pytest.fixture
def gie_crds(kubectl: Kubectl, kube_api: client.ApiClient) -> Iterator[None]:
    """GIE's InferencePool and InferenceObjective CRDs (the picker needs both served)."""
    install_inference_pool_crd(kubectl)
    install_inference_objective_crd(kubectl)
    yield
    remove_inference_objective_crd(kubectl)
    remove_inference_pool_crd(kubectl, kube_api)
