"""A worker's P/D parts, wired to its engine (docs/pd.md#roles)."""

from __future__ import annotations

from dataclasses import dataclass

from genpool_worker.engine import GenEngine
from genpool_worker.metrics import WorkerMetrics
from genpool_worker.pd.context import PDContext, Role
from genpool_worker.pd.endpoints import Prefillers
from genpool_worker.pd.exports import ExportRegistry
from genpool_worker.pd.metrics import PDMetrics
from genpool_worker.worker_config import DEFAULT_KV_EXPORT_TIMEOUT_S, WorkerConfig


@dataclass(frozen=True, slots=True)
class PDSettings:
    role: Role = Role.BOTH
    prefillers: tuple[str, ...] = ()
    kv_export_timeout_s: float = DEFAULT_KV_EXPORT_TIMEOUT_S

    @classmethod
    def from_config(cls, config: WorkerConfig) -> PDSettings:
        return cls(Role(config.role), config.prefiller_endpoints(), config.kv_export_timeout_s)


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
    return PDContext(settings.role, layout, pd_metrics, exports, Prefillers(settings.prefillers))
