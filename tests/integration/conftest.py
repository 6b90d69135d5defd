"""Fixtures for the pod runner's tests (the cluster fixtures live in tests/conftest.py)."""

from __future__ import annotations

import pytest
from kubernetes import client

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
