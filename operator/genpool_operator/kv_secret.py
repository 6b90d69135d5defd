"""A GenPool's KV secret (docs/operations.md#threat-model): what a prefill worker asks of a
KV pull or cancel, so that only the pool's own decode workers can read or free its KV.

The operator cannot read Secrets (docs/operations.md#rbac-least-privilege), so it cannot
keep a random value it wrote. It derives the secret instead: HMAC-SHA256 of the pool's
identity (namespace, name, uid) keyed by the operator's admin token. The same pool gets
the same secret every reconcile and after a restart; another pool (or this one deleted
and created again) gets another; rotating the admin token rotates every pool's. Pure."""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import TYPE_CHECKING, Any

from genpool_core.names import KV_SECRET_KEY

if TYPE_CHECKING:
    from genpool_operator.builders import PoolRef

# What the HMAC signs before the pool's identity: a value for no other purpose.
PURPOSE = "genpool-kv-secret/v1"


def kv_secret_name(pool: str) -> str:
    return f"{pool}-kv-secret"


def kv_secret_value(admin_token: str, pool: PoolRef) -> str:
    """64 hex digits, the pool's; the admin token cannot be read back from it."""
    identity = "\0".join((PURPOSE, pool.namespace, pool.name, pool.uid))
    return hmac.new(admin_token.encode(), identity.encode(), hashlib.sha256).hexdigest()


def build_kv_secret(pool: PoolRef, admin_token: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """The Secret both tiers mount (``metadata``: the builders' labels and owner)."""
    # data, not stringData: what is read back equals what was written, so patches are no-ops.
    encoded = base64.b64encode(kv_secret_value(admin_token, pool).encode()).decode()
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "type": "Opaque",
            "data": {KV_SECRET_KEY: encoded}}  # fmt: skip
