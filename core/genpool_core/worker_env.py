"""The worker pod's environment: set by the operator's pod template, read by the worker
(its CLI, its preStop drain) and by the operator itself (the admin token it sends)."""

from __future__ import annotations

WORKER_CONFIG_ENV = "GENPOOL_WORKER_CONFIG"  # the ConfigMap's worker config (JSON)
ADMIN_TOKEN_ENV = "GENPOOL_ADMIN_TOKEN"  # PUT /config and /drain's bearer token
DRAIN_TIMEOUT_ENV = "GENPOOL_DRAIN_TIMEOUT_S"  # the preStop drain's limit
