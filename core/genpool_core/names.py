"""Names shared by the worker, the operator, the simulator and the devcluster: defined once.

Strings and numbers that two processes must agree on (a mode in a stat line, a field
of PUT /config, the worker's port, a label the operator selects pods by, the GenPool
API coordinates) live here so that a rename is one edit. The knobs and their bounds
are in :mod:`genpool_core.knobs`.
"""

from __future__ import annotations

import enum

# Preemption modes as the worker, its stat line and the simulator spell them.
OFF_MODE = "off"
TPOT_MODE = "tpot_budget"
SLO_MODE = "target_output_tps"
PREEMPTION_MODES = (OFF_MODE, TPOT_MODE, SLO_MODE)


class PreemptionMode(enum.Enum):
    """The preemption modes; parsed once from either spelling, compared as members."""

    OFF = OFF_MODE
    TPOT_BUDGET = TPOT_MODE
    TARGET_OUTPUT_TPS = SLO_MODE

    @property
    def crd(self) -> str:
        """The GenPool spec's spelling (``spec.preemption.mode``)."""
        return _CRD_SPELLING[self]

    @classmethod
    def from_crd(cls, text: str) -> PreemptionMode:
        return next(mode for mode, spelling in _CRD_SPELLING.items() if spelling == text)


_CRD_SPELLING = {
    PreemptionMode.OFF: "Off",
    PreemptionMode.TPOT_BUDGET: "TpotBudget",
    PreemptionMode.TARGET_OUTPUT_TPS: "TargetOutputTps",
}

# Defaults of the user-facing preemption settings (the CRD's defaults are the same).
DEFAULT_SLACK_S = 0.5
DEFAULT_MAX_PAUSES_PER_REQUEST = 2
DEFAULT_ADMISSION_TARGET_MIN_S = 0.25
DEFAULT_ADMISSION_TARGET_MAX_S = 30.0
DEFAULT_KV_BLOCK_SIZE = 16  # tokens per KV-cache block (vLLM's default too)
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # CUDA: the GPU share a worker may use by default
DEFAULT_STAT_INTERVAL_S = 30  # the operator's tuning.intervalSeconds, the worker's stat period

RECENT_STAT_LINES = 16  # periodic stat lines a worker serves on GET /statlines
GENERATION_FIELD = "generation"  # PUT /config's version: a worker refuses an older one

WORKER_PORT = 8000  # the worker's HTTP port (completions, /stats, /config, /drain)
# Where a worker publishes its KV events (vLLM's default ZMQ port; llm-d's subscriber dials it)
DEFAULT_KV_EVENTS_PORT = 5557
# Speculative decoding's n-gram drafter (the worker's --speculative-config, the CRD's
# engine.speculative): drafts a step, and n-gram sizes, at most.
MAX_SPECULATIVE_TOKENS = 16
MAX_PROMPT_LOOKUP = 64
# P/D (docs/pd.md): the worker's --role values, and llm-d's pod label that carries them
# (its picker selects prefill pods by it).
BOTH_ROLE = "both"
PREFILL_ROLE = "prefill"
DECODE_ROLE = "decode"
WORKER_ROLES = (BOTH_ROLE, PREFILL_ROLE, DECODE_ROLE)
ROLE_LABEL = "llm-d.ai/role"
# The pool's KV secret (docs/operations.md#threat-model): the operator's per-pool Secret,
# mounted into every worker pod; the worker reads the file the env var names.
KV_SECRET_FILE_ENV = "GENPOOL_KV_SECRET_FILE"
KV_SECRET_KEY = "secret"  # the Secret's key, the mounted file's name
KV_SECRET_MOUNT_PATH = "/var/run/genpool/kv-secret"
OPERATOR_METRICS_PORT = 8081  # the operator's Prometheus /metrics (kopf's /healthz is 8080)

# The GenPool API.
API_GROUP = "genpool.dev"
API_VERSION = "v1alpha1"
API_PLURAL = "genpools"
API_KIND = "GenPool"
GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"

# Labels and annotations the operator puts on what it owns.
POOL_LABEL = f"{API_GROUP}/pool"  # on every worker pod: the pool it belongs to
GENERATION_ANNOTATION = f"{API_GROUP}/generation"  # on the StatefulSet: the GenPool's generation
CONFIG_HASH_ANNOTATION = f"{API_GROUP}/config-hash"  # on the pod template: worker.json's hash
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "genpool-operator"  # also the server-side-apply field manager

# The Gateway API Inference Extension's InferencePool (v1.0.0 and later), a GenPool child
# when spec.inferencePool.enabled: gateways route to the pods it selects.
INFERENCE_POOL_GROUP = "inference.networking.k8s.io"
INFERENCE_POOL_API_VERSION = f"{INFERENCE_POOL_GROUP}/v1"
INFERENCE_POOL_KIND = "InferencePool"
INFERENCE_POOL_PLURAL = "inferencepools"


def pool_label_selector(pool: str) -> str:
    """The label selector (``key=value``) of a pool's worker pods."""
    return f"{POOL_LABEL}={pool}"
