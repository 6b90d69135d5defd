"""The per-pool KV secret (docs/operations.md#threat-model): a Secret the operator derives
from its admin token for each pool (stable across reconciles and restarts without reading
any Secret back, different per pool), mounted read-only into both tiers' pods."""

from __future__ import annotations

import base64
from typing import Any

from genpool_core.names import KV_SECRET_FILE_ENV, KV_SECRET_KEY, KV_SECRET_MOUNT_PATH
from genpool_operator.builders import PoolRef, build_children
from genpool_operator.kv_secret import kv_secret_name, kv_secret_value
from genpool_operator.spec import GenPoolSpec
from tests.unit.operator.test_builders import IMAGE, POOLS, TOKEN, pool_ref


def _children(pool: PoolRef, token: str | None = TOKEN) -> list[dict[str, Any]]:
    spec = GenPoolSpec.from_body(POOLS["pd"])
    return build_children(pool, spec, image_default=IMAGE, admin_token=token)


def test_each_pool_has_its_own_stable_secret_derived_from_the_admin_token() -> None:
    a, b = pool_ref("a"), pool_ref("b")
    assert kv_secret_value(TOKEN, a) == kv_secret_value(TOKEN, a)  # reconcile after reconcile
    assert kv_secret_value(TOKEN, a) != kv_secret_value(TOKEN, b)
    assert kv_secret_value(TOKEN, a) != kv_secret_value("rotated", a)
    assert TOKEN not in kv_secret_value(TOKEN, a) and len(kv_secret_value(TOKEN, a)) == 64
    recreated = PoolRef(a.name, a.namespace, "another-uid", a.generation)
    assert kv_secret_value(TOKEN, recreated) != kv_secret_value(TOKEN, a)


def test_the_secret_is_a_child_and_both_tiers_mount_it() -> None:
    pool = pool_ref("pd")
    children = _children(pool)
    (secret,) = [c for c in children if c["metadata"]["name"] == kv_secret_name("pd")]
    assert secret["kind"] == "Secret" and secret["metadata"]["namespace"] == pool.namespace
    value = base64.b64decode(secret["data"][KV_SECRET_KEY]).decode()
    assert value == kv_secret_value(TOKEN, pool)
    workloads = [c for c in children if c["kind"] == "StatefulSet"]
    assert len(workloads) == 2  # the GEN (decode) tier and the prefill tier
    for sts in workloads:
        pod = sts["spec"]["template"]["spec"]
        volume = next(v for v in pod["volumes"] if v.get("secret"))
        assert volume["secret"]["secretName"] == kv_secret_name("pd")
        assert volume["secret"]["optional"] is True  # no admin token: no Secret, open pulls
        (container,) = pod["containers"]
        mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
        assert mount == {"name": volume["name"], "mountPath": KV_SECRET_MOUNT_PATH,
                         "readOnly": True}  # fmt: skip
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env[KV_SECRET_FILE_ENV] == f"{KV_SECRET_MOUNT_PATH}/{KV_SECRET_KEY}"


def test_no_admin_token_no_kv_secret() -> None:
    names = [c["metadata"]["name"] for c in _children(pool_ref("pd"), token=None)]
    assert kv_secret_name("pd") not in names
