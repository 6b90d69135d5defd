"""What the P/D parts of a worker share (docs/pd.md): its role, its KV connector (and
through it the exports and the cache's reads), the known prefill endpoints, the pool's KV
secret, the import caps, the HTTP client of pulls and prefill legs, and the P/D
metrics."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import httpx

from genpool_core.names import BOTH_ROLE, DECODE_ROLE, PREFILL_ROLE
from genpool_worker.kv_layout import KVLayout
from genpool_worker.pd.connector import PDConnector
from genpool_worker.pd.endpoints import Prefillers
from genpool_worker.pd.exports import ExportRegistry
from genpool_worker.pd.import_budget import ImportBudget
from genpool_worker.pd.metrics import PDMetrics

# A pull or prefill leg that cannot connect in this long falls back to a local prefill.
CONNECT_TIMEOUT_S = 2.0
PREFILL_LEG_TIMEOUT_S = 600.0  # a prefill leg waits in the prefill tier's queue too
PULL_READ_TIMEOUT_S = 30.0  # between two chunks of one pull
PREFILL_RETRIES = 3  # llm-d's sidecar retries 502/503/504 too


class Role(enum.Enum):
    BOTH = BOTH_ROLE
    PREFILL = PREFILL_ROLE
    DECODE = DECODE_ROLE

    @property
    def exports(self) -> bool:
        """It serves prefill legs (holds KV for a decode worker)."""
        return self is not Role.DECODE

    @property
    def imports(self) -> bool:
        """It pulls a GenPool handle's KV and sends prefill legs itself."""
        return self is not Role.PREFILL


@dataclass
class PDContext:
    """``kv_secret``: the pool's secret that KV pulls and cancels carry (None: they are
    open, as the admin endpoints are without a token). ``trusts_prefiller_header``: follow
    ``x-prefiller-host-port`` to any endpoint, not only known ones. ``vocab_size``: a
    handle's first token must be in it."""

    role: Role
    layout: KVLayout | None  # None: this worker cannot move KV (tensor parallelism)
    metrics: PDMetrics
    connector: PDConnector  # the engine's: its exports, and the reads of their blocks
    prefillers: Prefillers = field(default_factory=Prefillers)
    kv_secret: str | None = None
    trusts_prefiller_header: bool = False
    imports: ImportBudget = field(default_factory=ImportBudget)
    vocab_size: int | None = None
    http: httpx.AsyncClient = field(
        default_factory=lambda: httpx.AsyncClient(
            timeout=httpx.Timeout(PULL_READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        )
    )

    @property
    def exports(self) -> ExportRegistry | None:
        """The finished prefill legs' KV held for pulls (None: this worker exports none)."""
        return self.connector.exports
