"""The phased closed-loop workload (``--phases``): clients per phase, in order."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Phase:
    duration_s: float
    clients: int


def parse_phases(text: str) -> list[Phase]:
    """``"120:150,240:300,240:180"``: (seconds, closed-loop clients) per phase, in order."""
    phases = []
    for index, item in enumerate(text.split(","), start=1):
        duration, sep, clients = item.strip().partition(":")
        if not sep:
            raise ValueError(f"phase {index} {item!r}: expected SECONDS:CLIENTS")
        try:
            seconds, count = float(duration), int(clients)
        except ValueError:
            raise ValueError(
                f"phase {index} {item!r}: SECONDS is a number, CLIENTS an integer"
            ) from None
        if not (math.isfinite(seconds) and seconds > 0) or count < 0:
            raise ValueError(f"phase {index} {item!r}: need SECONDS > 0 and CLIENTS >= 0")
        phases.append(Phase(seconds, count))
    if not any(phase.clients for phase in phases):
        raise ValueError("phases: at least one phase needs clients")
    return phases


def phase_starts(phases: Sequence[Phase]) -> list[float]:
    starts, t = [], 0.0
    for phase in phases:
        starts.append(t)
        t += phase.duration_s
    return starts


def clients_at(phases: Sequence[Phase], t: float) -> int:
    """Clients allowed to send at ``t``; a phase owns its start instant; 0 after the end."""
    for start, phase in zip(phase_starts(phases), phases, strict=True):
        if start <= t < start + phase.duration_s:
            return phase.clients
    return 0
