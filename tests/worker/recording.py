"""Test-side recording of an engine's plans and outputs (rank-identity tests)."""

from __future__ import annotations

from genpool_core.plan import GenPlan
from genpool_core.request import FinishReason
from genpool_worker.engine_io import EngineRequest


class PlanRecorder:
    """An ``EngineObserver``: every plan's digest, and each finished request's tokens."""

    def __init__(self) -> None:
        self.plan_digests: list[str] = []
        self.completed: dict[str, list[int]] = {}

    def on_plan(self, plan: GenPlan) -> None:
        self.plan_digests.append(plan.digest())

    def on_finished(self, request: EngineRequest, reason: FinishReason) -> None:
        self.completed[request.request_id] = list(request.output_ids)
