"""The closed-loop workload: clients per phase (``--phases``), in order, each sending its
next request the moment its last one ends."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from genpool_sim.cluster import Cluster
from genpool_sim.records import SimRequest
from genpool_sim.workload import LengthSampler


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


def run_closed_loop(
    cluster: Cluster,
    phases: Sequence[Phase],
    duration_s: float,
    sampler: LengthSampler,
    rng: random.Random,
    next_id: Callable[[], int],
    submit: Callable[[SimRequest], None],
) -> None:
    """Clients that send their next request when the last one ends, per phase."""
    active: set[int] = set()

    def send(client: int, at: float) -> None:
        if at < duration_s and client < clients_at(phases, at):
            prompt, output = sampler.sample()
            submit(SimRequest(f"c{client}-{next_id()}", at, prompt, output, client))
        else:  # retired: the phase's client count fell below it (or the run ended)
            active.discard(client)

    def start_phase(at: float) -> None:
        for client in range(clients_at(phases, at)):
            if client not in active:  # staggered over the phase's first second
                active.add(client)
                send(client, at + rng.random())

    cluster.on_done = lambda request, now: send(request.client or 0, now)
    start_phase(0.0)
    for start in phase_starts(phases)[1:]:
        cluster.at(start, start_phase, order=0)
    cluster.run()
