"""The worker driven by the official OpenAI Python SDK, as real clients drive it: no
private field, so the pool's SLO machinery works only because every request is keyed
by default (docs/design.md#keyed-by-default). Synthetic model, real server on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import openai
import pytest

from genpool_core.statline import StatLine, parse_statline
from genpool_core.ttft_histogram import EDGES_S, bucket_of
from genpool_worker.arrival_key import ARRIVAL_HEADER
from genpool_worker.slo_request import TPOT_HEADER, TTFT_HEADER
from tests.polling import wait_for
from tests.worker.conftest import RunningWorker

Factory = Callable[..., RunningWorker]
MODEL = "synthetic:test"
HELLO: list[Any] = [{"role": "user", "content": "hello"}]
# A stat interval no test outlives: /statline is then the since-start line, live every pass.
SINCE_START = 3600.0


def sdk(worker: RunningWorker) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{worker.url}/v1", api_key="unused", max_retries=0)


def async_sdk(worker: RunningWorker) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{worker.url}/v1", api_key="unused", max_retries=0, timeout=120.0
    )


def stats(worker: RunningWorker) -> dict[str, Any]:
    with worker.client() as client:
        body: dict[str, Any] = client.get("/stats").json()
        return body


def statline(worker: RunningWorker) -> tuple[str, StatLine]:
    """The latest stat line, as text and parsed."""
    with worker.client() as client:
        text = client.get("/statline").text.strip()
    parsed = parse_statline(text)
    assert parsed is not None, text
    return text, parsed


def raw_fields(text: str) -> dict[str, str]:
    """A stat line's ``key=value`` tokens as written (``-`` stays ``-``)."""
    return dict(token.split("=", 1) for token in text.split() if "=" in token)


def stats_when(worker: RunningWorker, what: str, check: Callable[[dict[str, Any]], bool]) -> Any:
    """``/stats`` once ``check`` holds (the snapshot follows a reply by up to a pass)."""

    def ready() -> dict[str, Any] | None:
        now = stats(worker)
        return now if check(now) else None

    return wait_for(ready, what, timeout=20)


# -- the API surface ------------------------------------------------------------------


def test_completions_plain_and_streamed(worker_factory: Factory) -> None:
    with sdk(worker_factory()) as client:
        plain = client.completions.create(model=MODEL, prompt="hello", max_tokens=6)
        assert plain.object == "text_completion" and plain.model == MODEL
        choice = plain.choices[0]
        assert choice.finish_reason == "length" and len(choice.text) == 6
        assert plain.usage is not None
        assert (plain.usage.prompt_tokens, plain.usage.completion_tokens) == (5, 6)
        assert plain.usage.total_tokens == 11
        chunks = list(client.completions.create(model=MODEL, prompt="hello", max_tokens=6,
                                                stream=True))  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks) == choice.text  # greedy: same text
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


def test_chat_plain_and_streamed(worker_factory: Factory) -> None:
    with sdk(worker_factory()) as client:
        plain = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12)
        assert plain.object == "chat.completion" and plain.id.startswith("chatcmpl-")
        message = plain.choices[0].message
        assert message.role == "assistant" and message.content is not None
        assert len(message.content) == 12 and plain.choices[0].finish_reason == "length"
        assert plain.usage is not None and plain.usage.completion_tokens == 12
        # The new field name, as the SDK's own docs now spell the limit.
        same = client.chat.completions.create(model=MODEL, messages=HELLO,
                                              max_completion_tokens=12)  # fmt: skip
        assert same.choices[0].message.content == message.content
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=12, stream=True,
            stream_options={"include_usage": True},
        ))  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "length" and set(finish[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None  # the usage-only chunk
    assert chunks[-1].usage.completion_tokens == 12


def test_stop_strings_and_max_tokens(worker_factory: Factory) -> None:
    with sdk(worker_factory()) as client:
        free = client.completions.create(model=MODEL, prompt="ab", max_tokens=40)
        text = free.choices[0].text
        assert free.usage is not None and free.usage.completion_tokens == 40
        stop = text[10:13]
        before = text[: text.find(stop)]
        cut = client.completions.create(model=MODEL, prompt="ab", max_tokens=40,
                                         stop=[stop, "never-seen"])  # fmt: skip
        assert cut.choices[0].text == before and cut.choices[0].finish_reason == "stop"
        assert cut.usage is not None
        assert cut.usage.completion_tokens == len(before) + len(stop)  # one byte a token
        streamed = list(client.completions.create(model=MODEL, prompt="ab", max_tokens=40,
                                                  stop=stop, stream=True))  # fmt: skip
        assert "".join(c.choices[0].text for c in streamed) == before
        assert streamed[-1].choices[0].finish_reason == "stop"

        chat_free = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=30)
        reply = chat_free.choices[0].message.content
        assert reply is not None and chat_free.choices[0].finish_reason == "length"
        chat_stop = reply[5:8]
        chat_cut = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=30,
                                                  stop=chat_stop)  # fmt: skip
        assert chat_cut.choices[0].message.content == reply[: reply.find(chat_stop)]
        assert chat_cut.choices[0].finish_reason == "stop"
        for n in (1, 7):
            short = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=n)
            assert short.usage is not None and short.usage.completion_tokens == n
            assert short.choices[0].finish_reason == "length"
            assert short.choices[0].message.content == reply[:n]


def test_models_list(worker_factory: Factory) -> None:
    with sdk(worker_factory(max_seq_len=1024)) as client:
        models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].object == "model" and models.data[0].owned_by == "genpool"
    assert (models.data[0].model_extra or {}).get("max_model_len") == 1024


# (keyword arguments of create, expected exception, text our message must contain)
ERRORS: list[tuple[dict[str, Any], type[openai.APIStatusError], str]] = [
    ({"max_tokens": 5000}, openai.BadRequestError, "exceeds max_seq_len 2048"),
    ({"extra_headers": {TTFT_HEADER: "soon"}}, openai.BadRequestError, TTFT_HEADER),
    ({"extra_headers": {TPOT_HEADER: "0"}}, openai.BadRequestError, TPOT_HEADER),
    ({"extra_headers": {ARRIVAL_HEADER: "yesterday"}}, openai.BadRequestError, ARRIVAL_HEADER),
    ({"extra_headers": {ARRIVAL_HEADER: "-1"}}, openai.BadRequestError, ARRIVAL_HEADER),
    ({"extra_body": {"slo": {"tpot_ms": -5}}}, openai.BadRequestError, "slo.tpot_ms"),
    ({"top_p": 0.5}, openai.UnprocessableEntityError, "top_p=0.5 is not supported"),
    ({"extra_body": {"bogus": 1}}, openai.UnprocessableEntityError, "bogus"),
    ({"extra_headers": {ARRIVAL_HEADER: "FUTURE"}}, openai.UnprocessableEntityError,
     f"{ARRIVAL_HEADER} is"),
    ({"extra_body": {"genpool": {"keyed": False, "arrival_time": 1.0}}},
     openai.UnprocessableEntityError, "genpool.keyed is false but genpool.arrival_time"),
]  # fmt: skip


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_errors_surface_as_the_sdks_exceptions_with_our_message(
    worker_factory: Factory, endpoint: str
) -> None:
    worker = worker_factory()
    with sdk(worker) as client:

        def create(**kw: Any) -> object:
            kw.setdefault("max_tokens", 3)
            if endpoint == "chat":
                return client.chat.completions.create(model=MODEL, messages=HELLO, **kw)
            return client.completions.create(model=MODEL, prompt="hello", **kw)

        for kwargs, expected, text in ERRORS:
            headers = kwargs.get("extra_headers", {})
            if headers.get(ARRIVAL_HEADER) == "FUTURE":  # 60 s ahead: beyond the skew allowed
                kwargs = kwargs | {"extra_headers": {ARRIVAL_HEADER: f"{time.time() + 60:.3f}"}}
            with pytest.raises(openai.APIStatusError) as caught:
                create(**kwargs)
            error = caught.value
            assert type(error) is expected, (kwargs, error)
            assert text in str(error), (kwargs, str(error))
            assert isinstance(error.body, dict) and text in error.body["message"]
            assert error.body["code"] == error.status_code
        create()  # the worker still serves
        # A stamp a little ahead of this clock is within the skew allowed: clamped to now.
        create(extra_headers={ARRIVAL_HEADER: f"{time.time() + 2:.3f}"})
    assert stats_when(worker, "the two served", lambda s: s["completed_total"] == 2)


def test_a_full_queue_is_a_rate_limit_error(worker_factory: Factory) -> None:
    worker = worker_factory(max_batch_size=1, max_queue_length=1)

    async def scenario() -> openai.RateLimitError:
        async with async_sdk(worker) as client:
            running = await client.completions.create(model=MODEL, prompt="a", max_tokens=1000,
                                                      stream=True)  # fmt: skip
            chunks = aiter(running)
            await anext(chunks)  # a token: it holds the one batch slot
            # Accepted (the reply starts once the request is queued): the queue is full.
            queued = await client.completions.create(model=MODEL, prompt="b", max_tokens=2,
                                                     stream=True)  # fmt: skip
            try:
                with pytest.raises(openai.RateLimitError) as caught:
                    await client.completions.create(model=MODEL, prompt="c", max_tokens=2)
            finally:
                await running.close()  # the client leaves: the slot frees, the waiter runs
            last = [c async for c in queued][-1]  # nothing accepted is lost
            assert last.usage is not None and last.usage.completion_tokens == 2
            return caught.value

    error = asyncio.run(scenario())
    assert error.status_code == 429 and "admission queue is full (1 waiters)" in str(error)
    assert error.response.headers["retry-after"] == "1"


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
    worker = worker_factory(max_batch_size=1, stat_interval_s=SINCE_START)
    early = time.time() - 60.0  # a router saw it a minute ago

    async def scenario() -> list[str]:
        done: list[str] = []
        async with async_sdk(worker) as client:

            async def finish(name: str, stream: AsyncIterator[openai.types.Completion]) -> None:
                async for _ in stream:
                    pass
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
