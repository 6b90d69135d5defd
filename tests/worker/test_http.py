"""The worker's HTTP API against a real server on loopback (synthetic model)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx

from genpool_core.stats import SchedulerStats
from tests.polling import PollTimeout, wait_for, wait_for_async, wait_until
from tests.worker.conftest import RunningWorker

Factory = Callable[..., RunningWorker]


def live(worker: RunningWorker) -> SchedulerStats:
    """The scheduler's counts as of the engine's last pass (``/stats`` repeats the last
    stat line, which lags by up to ``stat_interval_s``)."""
    return worker.engine.snapshot.stats


async def until_engine(
    worker: RunningWorker, what: str, ok: Callable[[SchedulerStats], bool]
) -> SchedulerStats:
    """Wait, letting the loop's requests run, until the last pass's counts satisfy ``ok``."""
    try:
        return await wait_for_async(lambda: s if ok(s := live(worker)) else None, what, 30,
                                    interval=0.02)  # fmt: skip
    except PollTimeout as exc:
        raise PollTimeout(f"{exc}; the last pass: {live(worker)}") from None


def wait_idle(worker: RunningWorker, what: str) -> None:
    wait_for(lambda: worker.engine.inflight == 0, what, 30, interval=0.05)


def sse_texts(raw: str) -> tuple[str, list[dict[str, object]]]:
    chunks = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]"
    events = [json.loads(c) for c in chunks[:-1]]
    text = "".join(e["choices"][0]["text"] for e in events)
    return text, events


def test_completion_and_openai_shape(worker_factory: Factory) -> None:
    worker = worker_factory()
    with worker.client() as client:
        reply = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 6})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["object"] == "text_completion" and body["model"] == "synthetic:test"
        assert body["choices"][0]["finish_reason"] == "length"
        assert len(body["choices"][0]["text"]) == 6
        assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11,
                                 "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
        ids = client.post("/v1/completions", json={"prompt": [104, 105], "max_tokens": 2})
        assert ids.status_code == 200 and ids.json()["usage"]["prompt_tokens"] == 2
        assert client.get("/health").json() == {"status": "ok"}
        assert client.get("/ready").status_code == 200


def test_concurrent_streaming_completions(worker_factory: Factory) -> None:
    worker = worker_factory(max_batch_size=4)

    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, str, str]:
        body = {"prompt": f"request {i}", "max_tokens": 10 + i, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as reply:
            raw = "".join([part async for part in reply.aiter_text()])
            return reply.status_code, reply.headers["content-type"], raw

    async def all_of_them() -> list[tuple[int, str, str]]:
        async with worker.async_client() as client:
            return await asyncio.gather(*(one(client, i) for i in range(10)))

    for i, (status, content_type, raw) in enumerate(asyncio.run(all_of_them())):
        assert status == 200 and content_type.startswith("text/event-stream")
        text, events = sse_texts(raw)
        assert len(text) == 10 + i
        assert events[-1]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
        assert events[-1]["usage"]["completion_tokens"] == 10 + i  # type: ignore[index]


def plain_body(max_tokens: int) -> dict[str, object]:
    """What a client sends: no timing field; the worker keys it with its receipt time."""
    return {"prompt": "x", "max_tokens": max_tokens}


def test_pause_and_resume_visible_in_stats_under_overload(worker_factory: Factory) -> None:
    worker = worker_factory(
        max_batch_size=2, preemption_mode="target_output_tps", target_output_tps=5.0,
        paused_cap=2, resident_headroom=2, stat_interval_s=0.5,
    )  # fmt: skip

    async def load() -> list[httpx.Response]:
        async with worker.async_client() as client:
            # Warm-up: 32 admissions (keyed at receipt) initialise the adaptive target X.
            await asyncio.gather(*(client.post("/v1/completions", json=plain_body(2))
                                   for _ in range(32)))  # fmt: skip
            arrived = live(worker).arrivals  # the warm-up's replies came: all of them counted
            long = [asyncio.create_task(client.post("/v1/completions", json=plain_body(150)))
                    for _ in range(2)]  # fmt: skip
            await until_engine(worker, "both long ones resident before the short ones come",
                               lambda s: (s.arrivals, s.residents) == (arrived + 2, 2))  # fmt: skip
            short = [client.post("/v1/completions", json=plain_body(20)) for _ in range(6)]
            return list(await asyncio.gather(*long, *short))

    replies = asyncio.run(load())
    assert all(r.status_code == 200 for r in replies)
    assert [r.json()["usage"]["completion_tokens"] for r in replies] == [150] * 2 + [20] * 6
    with worker.client() as client:
        stats = wait_until(
            lambda: client.get("/stats").json(),
            lambda s: s["completed_total"] == 40 and s["pauses_total"] > 0,
            "a stat line with all 40 completions and a pause",
            30,
            interval=0.1,
        )
        assert stats["victims"] == {} or set(stats["victims"]) <= {
            "laxity", "below_target", "sacrificed"}  # fmt: skip
        assert stats["paused"] == 0 and stats["residents"] == 0
        metrics = client.get("/metrics").text
        pauses = [ln for ln in metrics.splitlines() if ln.startswith("genpool_pauses_total")]
        assert pauses and float(pauses[0].rsplit(" ", 1)[1]) > 0
        assert 'synthetic="true"' in metrics
        # Every completion was timed; TPOT too (all have > 1 token).
        for name in ("genpool_ttft_seconds_count", "genpool_tpot_seconds_count"):
            line = next(ln for ln in metrics.splitlines() if ln.startswith(name))
            assert float(line.rsplit(" ", 1)[1]) == stats["completed_total"], line


def test_put_config_changes_headroom_and_cap_live(worker_factory: Factory) -> None:
    worker = worker_factory(
        preemption_mode="tpot_budget", tpot_budget=0.2, resident_headroom=2, paused_cap=1,
        max_resident_headroom=6,
    )  # fmt: skip
    with worker.client() as client:
        before = client.get("/config").json()
        assert (before["resident_headroom"], before["paused_cap"], before["generation"]) == (
            2,
            1,
            0,
        )
        update = {"generation": 1, "resident_headroom": 5, "paused_cap": 4, "slack_s": 1.0}
        reply = client.put("/config", json=update)
        assert reply.status_code == 200, reply.text
        config = reply.json()
        assert (config["resident_headroom"], config["paused_cap"], config["slack_s"]) == (5, 4, 1.0)
        assert config["generation"] == 1 and config["in_force"]["paused_cap"] == 4
        assert client.put("/config", json=update).status_code == 200  # idempotent replay
        stale = client.put("/config", json={"generation": 0, "paused_cap": 0})
        assert stale.status_code == 409
        too_big = client.put("/config", json={"generation": 2, "resident_headroom": 7})
        assert too_big.status_code == 422 and "within [0, 6]" in too_big.text
        assert client.put("/config", json={"generation": 2, "paused_cap": 9}).status_code == 422
        assert client.put("/config", json={"generation": 2, "bogus": 1}).status_code == 422
        after = client.get("/config").json()
        assert (after["resident_headroom"], after["paused_cap"], after["generation"]) == (5, 4, 1)
        wait_until(
            lambda: client.get("/stats").json(),
            lambda s: (s["headroom"], s["cap"]) == (5, 4),
            "a stat line carrying the new headroom 5 and cap 4",
            30,
            interval=0.1,
        )


def test_drain_finishes_residents_then_refuses_with_503(worker_factory: Factory) -> None:
    worker = worker_factory(max_batch_size=2)

    async def scenario() -> tuple[list[httpx.Response], httpx.Response]:
        async with worker.async_client() as client:
            work = [asyncio.create_task(client.post("/v1/completions",
                                                    json={"prompt": "a", "max_tokens": 60}))
                    for _ in range(3)]  # fmt: skip
            await until_engine(worker, "all three requests taken in before the drain",
                               lambda s: s.residents + s.waiters == 3)  # fmt: skip
            drain = await client.post("/drain", json={"timeout_s": 30})
            return list(await asyncio.gather(*work)), drain

    done, drain = asyncio.run(scenario())
    assert drain.status_code == 200 and drain.json() == {"drained": True, "inflight": 0}
    assert [r.json()["usage"]["completion_tokens"] for r in done] == [60, 60, 60]
    with worker.client() as client:
        refused = client.post("/v1/completions", json={"prompt": "late", "max_tokens": 2})
        assert refused.status_code == 503 and "draining" in refused.text
        assert client.get("/ready").status_code == 503
        assert client.get("/health").status_code == 200


def test_full_queue_answers_429_with_retry_after(worker_factory: Factory) -> None:
    worker = worker_factory(max_batch_size=1, max_queue_length=2)

    async def scenario() -> tuple[list[httpx.Response], httpx.Response]:
        async with worker.async_client() as client:
            body = {"prompt": "a", "max_tokens": 80}
            first = asyncio.create_task(client.post("/v1/completions", json=body))
            await until_engine(worker, "the first request admitted, the queue empty again",
                               lambda s: s.residents == 1 and s.waiters == 0)  # fmt: skip
            queued = [asyncio.create_task(client.post("/v1/completions", json=body))
                      for _ in range(2)]  # fmt: skip
            await until_engine(worker, "two requests queued behind it: the queue full",
                               lambda s: s.residents == 1 and s.waiters == 2)  # fmt: skip
            extra = await client.post("/v1/completions", json=body)
            return list(await asyncio.gather(first, *queued)), extra

    accepted, extra = asyncio.run(scenario())
    assert extra.status_code == 429 and extra.headers["retry-after"] == "1"
    assert [r.status_code for r in accepted] == [200, 200, 200]  # nothing accepted is lost


def test_client_disconnect_frees_the_request(worker_factory: Factory) -> None:
    worker = worker_factory(max_batch_size=2)
    with worker.client() as client:
        with client.stream(
            "POST", "/v1/completions", json={"prompt": "a", "max_tokens": 500, "stream": True}
        ) as reply:
            for _ in reply.iter_lines():
                break  # fmt: skip
        wait_idle(worker, "the disconnected request to leave the engine")
        assert client.get("/stats").json()["aborted"] == 1


def test_a_waiting_client_that_disconnects_leaves_the_queue(worker_factory: Factory) -> None:
    worker = worker_factory(max_batch_size=1)

    async def scenario() -> httpx.Response:
        async with worker.async_client() as client:
            body = {"prompt": "a", "max_tokens": 60}
            running = asyncio.create_task(client.post("/v1/completions", json=body))
            # Admitted: the next request waits for the one slot.
            await until_engine(worker, "the first request admitted", lambda s: s.residents == 1)
            waiting = {"prompt": "b", "max_tokens": 5, "stream": True}
            async with client.stream("POST", "/v1/completions", json=waiting) as reply:
                assert reply.status_code == 200  # accepted into the queue, no token yet
            return await running  # the waiter's client went away meanwhile

    running = asyncio.run(scenario())
    assert running.json()["usage"]["completion_tokens"] == 60
    wait_idle(worker, "the waiter to finish too: nothing leaks")
    with worker.client() as client:
        stats = client.get("/stats").json()
        assert stats["aborted"] == 1 and stats["waiters"] == 0


def test_admin_endpoints_need_the_token(worker_factory: Factory) -> None:
    worker = worker_factory(admin_token="s3cret", preemption_mode="tpot_budget", tpot_budget=0.1)
    with worker.client() as client:
        update = {"generation": 1, "paused_cap": 1}
        assert client.put("/config", json=update).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert client.put("/config", json=update, headers=wrong).status_code == 403
        assert client.post("/drain", headers=wrong).status_code == 403
        assert client.post("/drain", headers={"Authorization": "Basic s3cret"}).status_code == 401
        right = {"Authorization": "Bearer s3cret"}
        assert client.put("/config", json=update, headers=right).status_code == 200
        assert client.get("/config").status_code == 200  # reads stay open
        assert client.post("/drain", headers=right).json()["drained"] is True


BAD_BODIES: list[bytes] = [
    b"", b"{", b"[]", b"null", b"42", b'"text"', b"{'prompt': 'x'}", b"\xff\xfe\x00",
    b'{"prompt": "\xc3\x28"}', b'{"prompt": NaN}', b'{"prompt": "x", "max_tokens": Infinity}',
    b"[" * 5000, b'{"prompt": "x"' + b" " * 10 + b"}}",
]  # fmt: skip


def bad_json_bodies() -> list[object]:
    bodies: list[object] = [
        {}, {"prompt": ""}, {"prompt": []}, {"prompt": None}, {"prompt": 5},
        {"prompt": [1, "a"]}, {"prompt": [-1]}, {"prompt": [10**9]}, {"prompt": {"a": 1}},
        {"prompt": "x", "max_tokens": 0}, {"prompt": "x", "max_tokens": -5},
        {"prompt": "x", "max_tokens": 10**12}, {"prompt": "x", "max_tokens": 3000},
        {"prompt": "x", "max_tokens": "ten"}, {"prompt": "x", "max_tokens": 2.5},
        {"prompt": "x", "max_tokens": True}, {"prompt": "x", "temperature": -1},
        {"prompt": "x", "temperature": 9}, {"prompt": "x", "temperature": "hot"},
        {"prompt": "x", "stream": "yes"}, {"prompt": "x", "seed": -1},
        {"prompt": "x", "bogus": 1}, {"prompt": "x", "genpool": {"arrival_time": -3}},
        {"prompt": "x", "genpool": {"arrival_time": "now"}}, {"prompt": "x", "genpool": 7},
        {"prompt": "x", "genpool": {"arrival_time": 4e12}}, {"prompt": "x", "genpool": {"x": 1}},
        {"prompt": "x", "genpool": {"first_token_time": -1.0}},
    ]  # fmt: skip
    return bodies


def test_fuzz_hundreds_of_bad_requests_all_4xx_and_the_worker_keeps_serving(
    worker_factory: Factory,
) -> None:
    worker = worker_factory(max_seq_len=2048)
    statuses: dict[int, int] = {}
    count = 0
    with worker.client() as client:
        for round_ in range(8):
            for raw in BAD_BODIES:
                reply = client.post("/v1/completions", content=raw)
                statuses[reply.status_code] = statuses.get(reply.status_code, 0) + 1
                assert 400 <= reply.status_code < 500, (raw[:40], reply.text)
                assert "error" in reply.json()
                count += 1
            for body in bad_json_bodies():
                reply = client.post("/v1/completions", json=body)
                assert 400 <= reply.status_code < 500, (body, reply.text)
                count += 1
            for raw in (b"{", b"[]", b'{"generation": -1}', b'{"generation": "1"}'):
                assert client.put("/config", content=raw).status_code in (400, 422)
                count += 1
            huge = b'{"prompt": "' + b"a" * (1 << 20) + b'"}'
            assert client.post("/v1/completions", content=huge).status_code == 413
            assert client.post("/drain", content=b'{"timeout_s": -1}').status_code == 422
            count += 2 + round_ * 0
        assert count >= 300
        good = client.post("/v1/completions", json={"prompt": "still alive", "max_tokens": 3})
        assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 3
        assert client.get("/health").status_code == 200
        metrics = client.get("/metrics").text
        invalid = [ln for ln in metrics.splitlines() if 'outcome="invalid"' in ln]
        assert invalid and float(invalid[0].rsplit(" ", 1)[1]) >= 250
