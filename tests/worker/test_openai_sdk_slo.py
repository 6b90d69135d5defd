"""The OpenAI SDK with no private field: llm-d's SLO headers take effect, and SLO mode
works because every request is keyed by default (docs/design.md#keyed-by-default);
``genpool.keyed: false`` and a router's arrival header do what they say."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import openai

from genpool_core.statline import parse_statline
from genpool_core.ttft_histogram import EDGES_S, bucket_of
from genpool_worker.arrival_key import ARRIVAL_HEADER
from genpool_worker.slo_request import TPOT_HEADER, TTFT_HEADER
from tests.worker.conftest import RunningWorker
from tests.worker.sdk_support import (
    HELLO,
    MODEL,
    SINCE_START,
    Factory,
    async_sdk,
    raw_fields,
    sdk,
    statline,
    stats_when,
)

# -- llm-d's per-request SLO headers, through extra_headers ----------------------------


def test_the_tpot_header_sets_the_requests_own_floor(worker_factory: Factory) -> None:
    # Mode off has no pool floor: below_target counts only requests with their own T_i.
    worker = worker_factory(stat_interval_s=SINCE_START)
    with sdk(worker) as client:
        client.completions.create(model=MODEL, prompt="plain", max_tokens=8)
        first = stats_when(worker, "the plain completion", lambda s: s["completed_total"] == 1)
        assert first["below_target_total"] is None
        assert "below_target=" not in statline(worker)[0]
        # 0.001 ms a token: T_i = 10^6 tokens/s, which no request meets.
        client.completions.create(model=MODEL, prompt="fast", max_tokens=8,
                                  extra_headers={TPOT_HEADER: "0.001"})  # fmt: skip
        missed = stats_when(worker, "the missed floor", lambda s: s["completed_total"] == 2)
        assert missed["below_target_total"] == 1.0
        # An hour a token: every request meets it. Chat takes the header too.
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8,
                                       extra_headers={TPOT_HEADER: "3600000"})  # fmt: skip
        met = stats_when(worker, "the met floor", lambda s: s["completed_total"] == 3)
    assert met["below_target_total"] == 0.5
    assert raw_fields(statline(worker)[0])["below_target"] == "0.500/0.500"


def test_the_ttft_header_makes_a_waiter_pause_a_resident(worker_factory: Factory) -> None:
    # B = 1 and no warm-up (X unset): a waiter without its own target is never at risk.
    worker = worker_factory(
        max_batch_size=1, preemption_mode="target_output_tps", target_output_tps=20.0,
        resident_headroom=1, paused_cap=1,
    )  # fmt: skip

    async def race(headers: dict[str, str]) -> list[str]:
        """Which finishes first: a long resident, or a short request sent after it started."""
        done: list[str] = []
        async with async_sdk(worker) as client:

            async def long_one() -> None:
                stream = await client.completions.create(
                    model=MODEL, prompt="long", max_tokens=300, stream=True
                )
                async for chunk in stream:
                    if not started.is_set():
                        started.set()
                    assert chunk.choices
                done.append("long")

            async def short_one() -> None:
                await started.wait()
                reply = await client.completions.create(
                    model=MODEL, prompt="short", max_tokens=5, extra_headers=headers
                )
                assert reply.usage is not None and reply.usage.completion_tokens == 5
                done.append("short")

            started = asyncio.Event()
            await asyncio.gather(long_one(), short_one())
        return done

    assert asyncio.run(race({})) == ["long", "short"]  # it waited for the slot
    control = stats_when(worker, "two completions", lambda s: s["completed_total"] == 2)
    assert control["pauses_total"] == 0
    # 100 ms to its first token: at risk at once, so the resident is paused in place.
    assert asyncio.run(race({TTFT_HEADER: "100"})) == ["short", "long"]
    after = stats_when(worker, "four completions", lambda s: s["completed_total"] == 4)
    assert after["pauses_total"] >= 1


# -- what real clients send is keyed: SLO mode works ------------------------------------

PAUSE_TRAFFIC = {"warm_up": 32, "long": 2, "short": 6}


async def slo_overload(worker: RunningWorker, extra_body: dict[str, object] | None) -> list[str]:
    """Overload in SLO mode (B = 2) through the SDK, ``extra_body`` in every request; the
    stat lines published meanwhile (polled: a line's TTFT fields cover its own window)."""
    lines: list[str] = []
    finished = asyncio.Event()

    async def watch() -> None:
        async with httpx.AsyncClient(base_url=worker.url, timeout=30.0) as http:
            while not finished.is_set():
                text = (await http.get("/statline")).text.strip()
                if not lines or lines[-1] != text:
                    lines.append(text)
                await asyncio.sleep(0.05)  # the polling period, not a synchronisation

    async def drain(stream: AsyncIterator[openai.types.Completion]) -> int:
        usage = None
        async for chunk in stream:
            usage = chunk.usage
        assert usage is not None
        return usage.completion_tokens

    async def one(client: openai.AsyncOpenAI, max_tokens: int) -> int:
        reply = await client.completions.create(
            model=MODEL, prompt="s", max_tokens=max_tokens, extra_body=extra_body
        )
        assert reply.usage is not None
        return reply.usage.completion_tokens

    watcher = asyncio.create_task(watch())
    try:
        async with async_sdk(worker) as client:
            # Warm-up: 32 admissions (keyed at receipt) initialise the adaptive target X.
            await asyncio.gather(*(one(client, 2) for _ in range(PAUSE_TRAFFIC["warm_up"])))
            # Two long requests fill B = 2 (each has had its first token) ...
            longs = [
                await client.completions.create(
                    model=MODEL, prompt="l", max_tokens=200, stream=True, extra_body=extra_body
                )
                for _ in range(PAUSE_TRAFFIC["long"])
            ]
            streams = [aiter(s) for s in longs]
            for stream in streams:
                assert (await anext(stream)).choices[0].finish_reason is None
            # ... and short ones wait until they are at risk (X - slack_s), and pause them.
            shorts = [one(client, 20) for _ in range(PAUSE_TRAFFIC["short"])]
            counts = await asyncio.gather(*(drain(s) for s in streams), *shorts)
    finally:
        finished.set()
        await watcher
    assert counts == [200] * PAUSE_TRAFFIC["long"] + [20] * PAUSE_TRAFFIC["short"]
    return lines


def overload_worker(worker_factory: Factory) -> RunningWorker:
    return worker_factory(
        max_batch_size=2, preemption_mode="target_output_tps", target_output_tps=10.0,
        paused_cap=2, resident_headroom=2, stat_interval_s=0.5,
    )  # fmt: skip


def test_sdk_traffic_without_private_fields_pauses_and_fills_the_stat_line(
    worker_factory: Factory,
) -> None:
    worker = overload_worker(worker_factory)
    published = asyncio.run(slo_overload(worker, None))
    total = sum(PAUSE_TRAFFIC.values())
    final = stats_when(
        worker,
        "every completion and a pause",
        lambda s: s["completed_total"] == total and s["pauses_total"] > 0,
    )
    assert final["paused"] == 0 and final["residents"] == 0
    with worker.client() as client:
        metrics = client.get("/metrics").text
    pauses = [ln for ln in metrics.splitlines() if ln.startswith("genpool_pauses_total{")]
    assert pauses and float(pauses[0].rsplit(" ", 1)[1]) > 0
    text, line = statline(worker)
    fields = raw_fields(text)
    assert fields["X"] != "-" and line.admission_target_s is not None  # warm-up took them
    assert fields["below_target"] != "-/-" and line.below_target_total is not None
    assert line.pauses_total > 0
    # The load's own windows carry its GEN TTFT: the histogram and its p90.
    with_ttft = [
        p for p in map(parse_statline, published) if p is not None and sum(p.ttft_hist) > 0
    ]
    assert with_ttft, published
    assert all(p.ttft_p90 is not None for p in with_ttft)
    assert any(raw_fields(t).get("ttft_p90", "-") != "-" for t in published)
    assert any(raw_fields(t).get("ttft_hist", "-") != "-" for t in published)


def test_keyed_false_traffic_stays_unkeyed(worker_factory: Factory) -> None:
    worker = overload_worker(worker_factory)
    published = asyncio.run(slo_overload(worker, {"genpool": {"keyed": False}}))
    total = sum(PAUSE_TRAFFIC.values())
    final = stats_when(worker, "every completion", lambda s: s["completed_total"] == total)
    # The same load as above, but nothing was keyed: no X, nothing at risk, no pause.
    assert final["pauses_total"] == 0 and final["admission_target_s"] is None
    assert final["below_target_total"] is None
    text, line = statline(worker)
    fields = raw_fields(text)
    assert (fields["X"], fields["below_target"], fields["pauses"].split("/")[1]) == (
        "-", "-/-", "0")  # fmt: skip
    assert line.arrivals_total == total  # it did see the traffic ...
    parsed = [p for p in map(parse_statline, published) if p is not None]
    assert parsed and all(sum(p.ttft_hist) == 0 for p in parsed)  # ... and timed none of it
    assert all(raw_fields(t).get("ttft_p90", "-") == "-" for t in published)


def test_a_past_arrival_header_is_admitted_first_and_timed_from_then(
    worker_factory: Factory,
) -> None:
    # A router that queues this long is told so (--max-arrival-age-s; default 5 s).
    worker = worker_factory(max_batch_size=1, stat_interval_s=SINCE_START, max_arrival_age_s=600)
    early = time.time() - 60.0  # a router saw it a minute ago

    async def scenario() -> list[str]:
        done: list[str] = []
        async with async_sdk(worker) as client:

            async def finish(name: str, stream: AsyncIterator[openai.types.Completion]) -> None:
                chunks = [chunk async for chunk in stream]
                assert chunks and chunks[-1].choices[0].finish_reason == "length", name
                done.append(name)

            running = await client.completions.create(model=MODEL, prompt="l", max_tokens=200,
                                                      stream=True)  # fmt: skip
            chunks = aiter(running)
            await anext(chunks)  # it holds the one slot: the next two queue
            # Each reply starts once its request is accepted, so they queue in this order.
            first = await client.completions.create(model=MODEL, prompt="a", max_tokens=4,
                                                    stream=True)  # fmt: skip
            second = await client.completions.create(
                model=MODEL, prompt="b", max_tokens=4, stream=True,
                extra_headers={ARRIVAL_HEADER: f"{early:.3f}"},
            )  # fmt: skip
            await asyncio.gather(finish("running", chunks), finish("sent first", first),
                                 finish("stamped early", second))  # fmt: skip
        return done

    # Admission is oldest arrival first: the stamp, not the receipt, is its arrival.
    assert asyncio.run(scenario()) == ["running", "stamped early", "sent first"]
    stats_when(worker, "three completions", lambda s: s["completed_total"] == 3)
    text, line = statline(worker)
    assert sum(line.ttft_hist) == 3
    # Its GEN TTFT runs from the stamp: a minute or more; the other two queued for seconds.
    minute = bucket_of(60.0)
    assert sum(line.ttft_hist[minute:]) == 1 and sum(line.ttft_hist[: bucket_of(30.0)]) == 2, text
    assert line.ttft_p90 is not None and line.ttft_p90 >= EDGES_S[minute - 1], text
