"""A worker's P/D parts (docs/pd.md#roles), built before its engine: the KV connector the
engine is constructed with, the edge its routes call and P/D's own routes, handed to
``server.create_app`` as ``kv_edge.KVTransferParts``."""

from __future__ import annotations

from dataclasses import dataclass

from genpool_worker.engine_io import ModelInfo
from genpool_worker.host_port import parse_endpoints
from genpool_worker.kv_connector import KVCachePort
from genpool_worker.kv_edge import KVTransferParts
from genpool_worker.metrics import WorkerMetrics
from genpool_worker.pd import routes
from genpool_worker.pd.connector import PDConnector
from genpool_worker.pd.context import PDContext, Role
from genpool_worker.pd.edge import PDEdge
from genpool_worker.pd.endpoints import Prefillers
from genpool_worker.pd.flags import (
    DEFAULT_KV_EXPORT_TIMEOUT_S,
    DEFAULT_MAX_KV_IMPORT_BYTES,
    DEFAULT_MAX_KV_PULLS,
    PDFlags,
)
from genpool_worker.pd.import_budget import ImportBudget
from genpool_worker.pd.metrics import PDMetrics


@dataclass(frozen=True, slots=True)
class PDSettings:
    role: Role = Role.BOTH
    prefillers: tuple[str, ...] = ()
    kv_export_timeout_s: float = DEFAULT_KV_EXPORT_TIMEOUT_S
    kv_secret: str | None = None  # read from --kv-secret-file by the CLI
    trusts_prefiller_header: bool = False
    max_kv_pulls: int = DEFAULT_MAX_KV_PULLS
    max_kv_import_bytes: int = DEFAULT_MAX_KV_IMPORT_BYTES

    @classmethod
    def from_config(cls, config: PDFlags, kv_secret: str | None = None) -> PDSettings:
        prefillers = parse_endpoints(config.prefillers.split(","))
        return cls(Role(config.role), prefillers, config.kv_export_timeout_s, kv_secret,
                   config.trust_prefiller_header, config.max_kv_pulls,
                   config.max_kv_import_bytes)  # fmt: skip


def build_pd(
    cache: KVCachePort, info: ModelInfo, metrics: WorkerMetrics, settings: PDSettings
) -> KVTransferParts:
    """The role's parts over the runner's KV ``cache``: a worker that exports gets the
    registry its connector feeds (and sweeps); a cache without a layout (tensor
    parallelism) moves no KV."""
    layout = cache.kv_layout()

    def num_held() -> int:
        exports = connector.exports
        return 0 if exports is None else exports.num_held

    pd_metrics = PDMetrics(metrics.registry, num_held)
    connector = PDConnector(
        cache,
        info.kv_block_size,
        export_timeout_s=(
            settings.kv_export_timeout_s if settings.role.exports and layout is not None else None
        ),
        on_export_outcome=pd_metrics.count_export,
    )
    budget = ImportBudget(settings.max_kv_pulls, settings.max_kv_import_bytes)
    context = PDContext(settings.role, layout, pd_metrics, connector,
                        Prefillers(settings.prefillers), kv_secret=settings.kv_secret or None,
                        trusts_prefiller_header=settings.trusts_prefiller_header,
                        imports=budget, vocab_size=info.vocab_size)  # fmt: skip
    return KVTransferParts(connector, PDEdge(context), routes.router, routes.OPENAPI_BODIES)
