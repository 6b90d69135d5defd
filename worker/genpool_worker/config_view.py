"""``GET /config``'s body: the knobs in force, as the operator reads them."""

from __future__ import annotations

from typing import Any

from genpool_core.scheduler import GenScheduler


def config_view(scheduler: GenScheduler) -> dict[str, Any]:
    headroom, cap = scheduler.capacity_in_force()
    target = scheduler.queue.target
    return {
        "generation": scheduler.live_config().generation,
        "mode": scheduler.policy.mode.value,
        "resident_headroom": scheduler.slots.resident_headroom(),
        "max_resident_headroom": scheduler.slots.max_resident_headroom(),
        "paused_cap": scheduler.knobs.paused_cap,
        "slack_s": scheduler.queue.slack_s,
        "admission_target_min_s": target.x_min,
        "admission_target_max_s": target.x_max,
        "in_force": {"resident_headroom": headroom, "paused_cap": cap},
    }
