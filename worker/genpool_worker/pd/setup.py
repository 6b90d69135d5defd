"""A worker's P/D parts, wired to its engine (docs/pd.md#roles)."""

from __future__ import annotations

from dataclasses import dataclass

from genpool_worker.engine import GenEngine
from genpool_worker.metrics import WorkerMetrics
from genpool_worker.pd.context import PDContext, Role
from genpool_worker.pd.endpoints import Prefillers
from genpool_worker.pd.exports import ExportRegistry
from genpool_worker.pd.import_budget import (
    DEFAULT_MAX_KV_IMPORT_BYTES,
    DEFAULT_MAX_KV_PULLS,
    ImportBudget,
)
from genpool_worker.pd.metrics import PDMetrics
from genpool_worker.worker_config import DEFAULT_KV_EXPORT_TIMEOUT_S, WorkerConfig


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
    def from_config(cls, config: WorkerConfig, kv_secret: str | None = None) -> PDSettings:
        return cls(Role(config.role), config.prefiller_endpoints(), config.kv_export_timeout_s,
                   kv_secret, config.trust_prefiller_header, config.max_kv_pulls,
                   config.max_kv_import_bytes)  # fmt: skip


def build_pd_context(engine: GenEngine, metrics: WorkerMetrics, settings: PDSettings) -> PDContext:
    """The role's parts: a worker that exports gets the registry its engine feeds (and
    sweeps); a runner without a layout (tensor parallelism) moves no KV."""
    layout = engine.runner.kv_layout()
    exports: ExportRegistry | None = None
    pd_metrics: PDMetrics

    def num_held() -> int:
        return 0 if exports is None else exports.num_held

    pd_metrics = PDMetrics(metrics.registry, num_held)
    if settings.role.exports and layout is not None:
        exports = ExportRegistry(
            engine.release_kv,
            timeout_s=settings.kv_export_timeout_s,
            on_outcome=pd_metrics.count_export,
        )
        engine.kv_handoff.exports = exports
    budget = ImportBudget(settings.max_kv_pulls, settings.max_kv_import_bytes)
    return PDContext(settings.role, layout, pd_metrics, exports, Prefillers(settings.prefillers),
                     kv_secret=settings.kv_secret or None,
                     trusts_prefiller_header=settings.trusts_prefiller_header, imports=budget,
                     vocab_size=engine.model_info.vocab_size)  # fmt: skip
