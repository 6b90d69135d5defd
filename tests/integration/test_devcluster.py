"""The local control plane is a real one: versions, controllers, GC, tokens, RBAC."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from genpool_devcluster import build
from tests.conftest import Kubectl
from tests.polling import wait_for


def _gone(read: Callable[[], object]) -> bool:
    try:
        read()
    except ApiException as err:
        if err.status == 404:
            return True
        raise
    return False


def test_server_reports_the_built_version(kube_api: client.ApiClient, kubectl: Kubectl) -> None:
    info = client.VersionApi(kube_api).get_code()
    assert info.git_version == build.K8S_VERSION
    assert (info.major, info.minor) == ("1", "35")
    server = json.loads(kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert server["gitVersion"] == build.K8S_VERSION


def test_namespace_create_and_delete(kube_api: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_api)
    name = f"it-ns-{uuid.uuid4().hex[:8]}"  # unique: a reused cluster may hold an old one
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    # The controller-manager gives every namespace its `default` ServiceAccount.
    wait_for(lambda: not _gone(lambda: core.read_namespaced_service_account("default", name)),
             "default ServiceAccount")  # fmt: skip
    core.delete_namespace(name)
    # The namespace controller empties it and removes the `kubernetes` finalizer.
    wait_for(lambda: _gone(lambda: core.read_namespace(name)), "namespace deletion")


def _deployment(name: str, replicas: int) -> client.V1Deployment:
    labels = {"app": name}
    container = client.V1Container(name="main", image="busybox", command=["sleep", "3600"])
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[container], termination_grace_period_seconds=1),
            ),
        ),
    )


def test_deployment_controller_makes_pods(kube_api: client.ApiClient, namespace: str) -> None:
    apps, core = client.AppsV1Api(kube_api), client.CoreV1Api(kube_api)
    apps.create_namespaced_deployment(namespace, _deployment("web", replicas=2))

    def pods() -> list[client.V1Pod]:
        return core.list_namespaced_pod(namespace, label_selector="app=web").items

    wait_for(lambda: len(pods()) == 2, "2 pods from the ReplicaSet")
    owners = {ref.kind for p in pods() for ref in p.metadata.owner_references}
    assert owners == {"ReplicaSet"}
    rs = apps.list_namespaced_replica_set(namespace).items
    assert [r.metadata.owner_references[0].name for r in rs] == ["web"]


def test_garbage_collector_deletes_orphaned_dependents(
    kube_api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    parent = core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="parent"))
    )
    ref = client.V1OwnerReference(
        api_version="v1", kind="ConfigMap", name="parent", uid=parent.metadata.uid
    )
    child_meta = client.V1ObjectMeta(name="child", owner_references=[ref])
    core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=child_meta))
    core.delete_namespaced_config_map("parent", namespace)
    wait_for(
        lambda: _gone(lambda: core.read_namespaced_config_map("child", namespace)),
        "garbage collection of the child ConfigMap",
    )


def _as_token(kube_api: client.ApiClient, token: str) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = kube_api.configuration.host
    cfg.ssl_ca_cert = kube_api.configuration.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(cfg)


def test_token_request_and_rbac(kube_api: client.ApiClient, namespace: str) -> None:
    core, rbac = client.CoreV1Api(kube_api), client.RbacAuthorizationV1Api(kube_api)
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="robot"))
    )
    spec = client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)
    req = client.AuthenticationV1TokenRequest(spec=spec)
    token = core.create_namespaced_service_account_token("robot", namespace, req).status.token
    assert token

    with _as_token(kube_api, token) as robot_api:
        robot = client.CoreV1Api(robot_api)
        with pytest.raises(ApiException) as denied:
            robot.list_namespaced_secret(namespace)
        assert denied.value.status == 403
        assert f"system:serviceaccount:{namespace}:robot" in denied.value.body

        # RBAC also grants: a Role + RoleBinding for ConfigMaps opens exactly that.
        rule = client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["list"])
        role = client.V1Role(metadata=client.V1ObjectMeta(name="cm-reader"), rules=[rule])
        rbac.create_namespaced_role(namespace, role)
        subject = client.RbacV1Subject(kind="ServiceAccount", name="robot", namespace=namespace)
        binding = client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="cm-reader"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role",
                                      name="cm-reader"),
            subjects=[subject],
        )  # fmt: skip
        rbac.create_namespaced_role_binding(namespace, binding)
        wait_for(lambda: _allowed(lambda: robot.list_namespaced_config_map(namespace)),
                 "RoleBinding to take effect", timeout=10)  # fmt: skip


def _allowed(call: Callable[[], object]) -> bool:
    try:
        call()
    except ApiException as err:
        if err.status == 403:
            return False
        raise
    return True


def test_kubectl_helper_talks_to_the_cluster(kubectl: Kubectl) -> None:
    out = kubectl("get", "namespace", "default", "-o", "name").stdout
    assert out.strip() == "namespace/default"
