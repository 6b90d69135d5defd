"""The demo's open-loop phased load: quiet, a burst, quiet again, mixed request lengths,
two request classes.

:func:`plan_arrivals` is pure and seeded: Poisson arrivals per phase (rate in requests
per second), each request's length drawn from :data:`LENGTH_MIX` and its class from
:data:`CLASSES`, so two pools given the same plan see exactly the same requests at the
same offsets. A class is what its requests send: ``interactive`` states its own SLO in
llm-d's headers (a tight TTFT and a higher output rate), ``batch`` sends none and gets
the pool's. Neither sends a private field: the worker keys each on receipt.
:func:`open_loop` sends them on time whatever the pool's latency (an open loop: a
slow pool does not slow its own load down, which a closed loop would).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from genpool_core.names import WORKER_PORT
from genpool_devcluster.loadgen import PROMPTS, Picker, PodPicker, RequestResult, one_request
from genpool_operator.kube import Kube, load_config
from genpool_worker.slo_request import TPOT_HEADER, TTFT_HEADER

# (max_tokens, weight): mostly short answers, some long ones (mean about 59 tokens).
LENGTH_MIX: tuple[tuple[int, float], ...] = ((16, 0.5), (64, 0.35), (192, 0.15))


@dataclass(frozen=True)
class RequestClass:
    name: str
    share: float  # of the arrivals
    ttft_s: float | None  # its own TTFT target (x-llm-d-slo-ttft-ms); None: the pool's
    output_tps: float | None  # its own output-rate floor T_i (x-llm-d-slo-tpot-ms)

    def headers(self) -> dict[str, str]:
        headers = {}
        if self.ttft_s is not None:
            headers[TTFT_HEADER] = f"{self.ttft_s * 1000:g}"
        if self.output_tps is not None:
            headers[TPOT_HEADER] = f"{1000 / self.output_tps:g}"
        return headers


CLASSES: tuple[RequestClass, ...] = (
    RequestClass("interactive", 0.3, ttft_s=1.0, output_tps=20.0),
    RequestClass("batch", 0.7, ttft_s=None, output_tps=None),
)
CLASS_BY_NAME = {c.name: c for c in CLASSES}
SAMPLE_PERIOD_S = 1.0  # how often the pools are sampled (ready pods, paused residents)


@dataclass(frozen=True)
class Phase:
    name: str
    duration_s: float
    rate_per_s: float  # mean arrivals per second (Poisson)


@dataclass(frozen=True)
class PlannedRequest:
    at_s: float  # offset from the load's start
    phase: str
    prompt: str
    max_tokens: int
    klass: str = CLASSES[-1].name  # a name in CLASSES


@dataclass(frozen=True)
class PoolSample:
    """One look at a pool: ready workers (routable), worker pods that exist (ready,
    starting or draining: what the pool costs) and requests paused in place."""

    t: float  # offset s from the load's start
    ready: int
    pods: int
    paused: int


@dataclass(frozen=True)
class SentRequest:
    """One planned request and what came of it."""

    planned: PlannedRequest
    result: RequestResult


def phase_bounds(phases: Sequence[Phase]) -> list[tuple[str, float, float]]:
    """Each phase's (name, start, end) offsets in seconds."""
    bounds, start = [], 0.0
    for phase in phases:
        bounds.append((phase.name, start, start + phase.duration_s))
        start += phase.duration_s
    return bounds


def plan_arrivals(phases: Sequence[Phase], seed: int = 0) -> list[PlannedRequest]:
    """Poisson arrivals within each phase, lengths from LENGTH_MIX, classes from CLASSES;
    sorted by time."""
    rng = random.Random(seed)
    lengths, weights = zip(*LENGTH_MIX, strict=True)
    names, shares = [c.name for c in CLASSES], [c.share for c in CLASSES]
    plan: list[PlannedRequest] = []
    for name, start, end in phase_bounds(phases):
        rate = next(p.rate_per_s for p in phases if p.name == name)
        if rate <= 0:
            continue
        at = start + rng.expovariate(rate)
        while at < end:
            prompt = PROMPTS[rng.randrange(len(PROMPTS))]
            max_tokens = rng.choices(lengths, weights)[0]
            klass = rng.choices(names, shares)[0]
            plan.append(PlannedRequest(round(at, 4), name, prompt, max_tokens, klass))
            at += rng.expovariate(rate)
    return plan


async def open_loop(
    picker: Picker, plan: Sequence[PlannedRequest], started: float
) -> list[SentRequest]:
    """Send every planned request at ``started + at_s`` (``time.monotonic`` clock)."""
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
    async with httpx.AsyncClient(limits=limits) as http:

        async def send(planned: PlannedRequest) -> SentRequest:
            await asyncio.sleep(max(0.0, started + planned.at_s - time.monotonic()))
            headers = CLASS_BY_NAME[planned.klass].headers()
            result = await one_request(http, picker, planned.prompt, planned.max_tokens, headers)
            return SentRequest(planned, result)

        return list(await asyncio.gather(*(send(p) for p in plan)))


PoolRun = tuple[list[SentRequest], list[PoolSample]]


async def _paused(http: httpx.AsyncClient, picker: PodPicker) -> int:
    """Requests paused in place over the pool's ready workers (their ``/stats``)."""

    async def one(ip: str) -> int:
        with contextlib.suppress(httpx.HTTPError, OSError, ValueError, KeyError, TypeError):
            response = await http.get(f"http://{ip}:{WORKER_PORT}/stats", timeout=1.0)
            return int(response.json()["paused"])
        return 0  # a worker that did not answer in time (starting, draining) is not counted

    return sum(await asyncio.gather(*(one(t.ip) for t in picker.targets)))


async def _sample(picker: PodPicker, started: float, stop: asyncio.Event) -> list[PoolSample]:
    """Every second: ready and existing pods, paused residents."""
    samples = []
    async with httpx.AsyncClient() as http:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError, OSError):
                await picker.refresh()  # keeps the last list when the API blips
            paused = await _paused(http, picker)
            now = round(time.monotonic() - started, 2)
            samples.append(PoolSample(now, len(picker.targets), picker.num_pods, paused))
            with contextlib.suppress(TimeoutError):  # the sampling period; stop ends it early
                await asyncio.wait_for(stop.wait(), timeout=SAMPLE_PERIOD_S)
    return samples


def run_phased_load(
    kubeconfig: Path, plan: list[PlannedRequest], pools: tuple[str, ...], namespace: str
) -> dict[str, PoolRun]:
    """The same plan against every pool at once; each pool sampled every second."""

    async def main() -> dict[str, PoolRun]:
        kube = Kube(load_config(str(kubeconfig)))
        pickers = {name: PodPicker(kube, namespace, name) for name in pools}
        for picker in pickers.values():
            await picker.refresh()
        started, stop = time.monotonic() + 1.0, asyncio.Event()
        samplers = {n: asyncio.create_task(_sample(p, started, stop)) for n, p in pickers.items()}
        try:
            loads = await asyncio.gather(*(open_loop(p, plan, started) for p in pickers.values()))
        finally:
            stop.set()
            samples = {n: await task for n, task in samplers.items()}
            await kube.aclose()
        return {n: (sent, samples[n]) for n, sent in zip(pickers, loads, strict=True)}

    seconds = max((p.at_s for p in plan), default=0.0)
    print(f"  {len(plan)} requests over {seconds:.0f} s, the same to each pool ...", flush=True)
    return asyncio.run(main())
