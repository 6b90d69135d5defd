"""A closed-loop load generator for a GenPool's ready worker pods (e2e and demo).

It plays the router: it sends OpenAI streaming completions to the pool's ready pods
(discovered through the API, refreshed every second), as any client sends them (no
private fields: the worker keys each request with its receipt, docs/design.md#keyed-by-default;
per-request SLO headers when the caller gives them), and retries elsewhere only when a
pod refused a request before accepting it (503 while draining, 429, connection refused) — exactly
what a Service endpoint update does for a terminating pod. A request that was
accepted and then broke counts as failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from genpool_core.names import WORKER_PORT, pool_label_selector
from genpool_core.quantiles import percentile
from genpool_operator.kube import Kube, load_config, resource_path
from genpool_operator.scrape import PodTarget, ready_targets

PROMPTS = (
    "The capital of France is",
    "Write a short note about the ocean:",
    "List three prime numbers and explain why they are prime.",
    "Once upon a time, in a small village,",
    "The best way to learn a new language is",
    "Kubernetes schedules pods onto nodes by",
)
RETRYABLE = {429, 503}
DONE_PHASES = ("Succeeded", "Failed")
MAX_REFUSALS = 200


@dataclass(frozen=True)
class RequestResult:
    ok: bool
    pod: str
    ttft_s: float | None
    e2e_s: float
    tokens: int
    refusals: int
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.tokens - 1)


class Picker(Protocol):
    """Where the next request goes: a pod target, or None while no pod is ready."""

    def pick(self) -> PodTarget | None: ...


class StaticPicker:
    """A fixed list of targets, round-robin (one worker process in a bench)."""

    def __init__(self, targets: list[PodTarget]) -> None:
        self.targets = targets
        self._turn = itertools.count()

    def pick(self) -> PodTarget | None:
        return self.targets[next(self._turn) % len(self.targets)] if self.targets else None


class PodPicker:
    """Ready pods of one pool, refreshed in the background; round-robin."""

    def __init__(self, kube: Kube, namespace: str, pool: str) -> None:
        self._kube, self._namespace, self._pool = kube, namespace, pool
        self.targets: list[PodTarget] = []
        self.num_pods = 0  # the pool's pods that hold resources: ready, starting or draining
        self._turn = itertools.count()

    async def refresh(self) -> None:
        pods = await self._kube.list(
            resource_path("v1", "Pod", self._namespace), pool_label_selector(self._pool)
        )
        self.targets = ready_targets(pods)
        self.num_pods = sum(p.get("status", {}).get("phase") not in DONE_PHASES for p in pods)

    async def keep_fresh(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            # Keep the last known list when the API blips.
            with contextlib.suppress(httpx.HTTPError, OSError):
                await self.refresh()
            await asyncio.sleep(1.0)

    def pick(self) -> PodTarget | None:
        if not self.targets:
            return None
        return self.targets[next(self._turn) % len(self.targets)]


async def one_request(
    http: httpx.AsyncClient,
    picker: Picker,
    prompt: str,
    max_tokens: int,
    headers: Mapping[str, str] | None = None,
) -> RequestResult:
    start = time.time()
    refusals = 0
    while refusals < MAX_REFUSALS:
        target = picker.pick()
        if target is None:
            refusals += 1
            await asyncio.sleep(0.2)
            continue
        body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True}
        try:
            return await _stream(http, target, body, dict(headers or {}), start, refusals)
        except _Refused:
            refusals += 1
            await asyncio.sleep(0.1)
    return RequestResult(False, "", None, time.time() - start, 0, refusals, "no pod accepted")


class _Refused(Exception):
    """The pod turned the request away before accepting it: try another pod."""


async def _stream(
    http: httpx.AsyncClient,
    target: PodTarget,
    body: dict[str, Any],
    headers: dict[str, str],
    start: float,
    refusals: int,
) -> RequestResult:
    url = f"http://{target.ip}:{WORKER_PORT}/v1/completions"
    first: float | None = None
    tokens = 0
    try:
        async with http.stream("POST", url, json=body, headers=headers, timeout=120) as response:
            if response.status_code in RETRYABLE:
                raise _Refused
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:200]
                return RequestResult(
                    False, target.name, None, time.time() - start, 0, refusals, text
                )
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise httpx.ReadError(str(chunk["error"]))
                tokens += 1
                first = first or time.time()
    except (httpx.ConnectError, httpx.ConnectTimeout):
        if first is None:
            raise _Refused from None
        raise
    except httpx.HTTPError as exc:
        return RequestResult(
            False, target.name, None, time.time() - start, tokens, refusals, str(exc)
        )
    ttft = None if first is None else first - start
    return RequestResult(True, target.name, ttft, time.time() - start, tokens, refusals)


async def closed_loop(
    picker: Picker, *, clients: int, duration_s: float, max_tokens: int
) -> list[RequestResult]:
    """``clients`` users, each sending its next request when the last one ends."""
    results: list[RequestResult] = []
    deadline = time.monotonic() + duration_s
    limits = httpx.Limits(max_connections=clients * 2, max_keepalive_connections=clients * 2)
    async with httpx.AsyncClient(limits=limits) as http:

        async def user(index: int) -> None:
            for n in itertools.count():
                if time.monotonic() >= deadline:
                    return
                prompt = PROMPTS[(index + n) % len(PROMPTS)]
                results.append(await one_request(http, picker, prompt, max_tokens))

        await asyncio.gather(*(user(i) for i in range(clients)))
    return results


def run_closed_loop(
    kubeconfig: str, clients: int, duration_s: float, *, namespace: str, pool: str
) -> dict[str, Any]:
    """Closed-loop load (24 tokens a request) on a pool's ready pods; ``summarize``'s dict."""

    async def main() -> dict[str, Any]:
        kube = Kube(load_config(kubeconfig))
        picker = PodPicker(kube, namespace, pool)
        await picker.refresh()
        stop = asyncio.Event()
        refresher = asyncio.create_task(picker.keep_fresh(stop))
        try:
            results = await closed_loop(
                picker, clients=clients, duration_s=duration_s, max_tokens=24
            )
        finally:
            stop.set()
            await refresher
            await kube.aclose()
        return summarize(results, duration_s)

    return asyncio.run(main())


def summarize(results: list[RequestResult], duration_s: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpots = [t for r in ok if (t := r.tpot_s) is not None]
    e2es = [r.e2e_s for r in ok]
    return {
        "requests": len(results),
        "failed": len(results) - len(ok),
        "refusals_retried": sum(r.refusals for r in results),
        "ttft_p50_s": _quantile(ttfts, 50),
        "ttft_p90_s": _quantile(ttfts, 90),
        "tpot_mean_s": round(statistics.fmean(tpots), 4) if tpots else None,
        "e2e_p90_s": _quantile(e2es, 90),
        "tokens_per_s": round(sum(r.tokens for r in ok) / duration_s, 2),
        "errors": sorted({r.error for r in results if r.error})[:5],
    }


def _quantile(values: list[float], q: float) -> float | None:
    return round(percentile(values, q), 4) if values else None
