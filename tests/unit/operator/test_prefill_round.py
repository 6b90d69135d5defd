"""The prefill tier in a stats round (docs/pd.md): the endpoints of the ready prefill pods,
which decode workers are told them (``GET``/``PUT /prefillers``, against workers faked with
httpx's mock transport), the round's record and Event, and ``status.prefill``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from genpool_operator.prefill_plan import (
    PREFILLERS_PUSH_FAILED,
    PrefillCounts,
    PrefillRound,
    endpoint,
    mirror_patch,
    needs_push,
    parse_endpoints,
    prefill_endpoints,
    spec_patch,
)
from genpool_operator.round_plan import PushOutcome
from genpool_operator.scrape import PodTarget, WorkerClient
from genpool_operator.spec import GenPoolSpec
from genpool_operator.spec_sections import Prefill
from genpool_operator.statsloop import prefill_round, push_prefillers

TOKEN = "s3cret"


class FakeDecodeWorkers:
    """Decode workers by IP: what each reports on ``GET /prefillers``, the calls seen."""

    def __init__(self, reported: dict[str, Any]) -> None:
        self.reported = reported  # ip -> endpoints, or an int: the HTTP status it answers
        self.calls: list[tuple[str, str, str | None]] = []
        self.puts: dict[str, Any] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        ip = request.url.host
        self.calls.append((request.method, ip, request.headers.get("authorization")))
        assert request.url.path == "/prefillers" and request.url.port == 8000
        found = self.reported[ip]
        if found == "down":
            raise httpx.ConnectError("connection refused", request=request)
        if isinstance(found, int):
            return httpx.Response(found, json={"error": {"message": "nope"}})
        if request.method == "PUT":
            self.puts[ip] = json.loads(request.content)
            return httpx.Response(200, json=self.puts[ip])
        return httpx.Response(200, json={"endpoints": found})


def run_push(fake: FakeDecodeWorkers, endpoints: tuple[str, ...]) -> PushOutcome:
    async def scenario() -> PushOutcome:
        async with httpx.AsyncClient(transport=httpx.MockTransport(fake)) as http:
            targets = [PodTarget(f"w-{ip}", ip, "") for ip in fake.reported]
            return await push_prefillers(WorkerClient(http, TOKEN), targets, endpoints)

    return asyncio.run(scenario())


def test_only_the_workers_that_report_another_set_are_told() -> None:
    wanted = ("10.1.0.1:8000", "10.1.0.2:8000")
    fake = FakeDecodeWorkers({
        "10.0.0.1": ["10.1.0.2:8000", "10.1.0.1:8000"],  # the same set: left alone
        "10.0.0.2": ["10.1.0.1:8000"],  # a prefill pod came
        "10.0.0.3": [],  # started after the last round
    })  # fmt: skip
    outcome = run_push(fake, wanted)
    assert (outcome.num_in_sync, outcome.num_targets, outcome.errors) == (3, 3, {})
    assert fake.puts == {ip: {"endpoints": list(wanted)} for ip in ("10.0.0.2", "10.0.0.3")}
    assert {auth for _, _, auth in fake.calls} == {f"Bearer {TOKEN}"}
    assert run_push(FakeDecodeWorkers({"10.0.0.1": list(wanted)}), wanted).num_in_sync == 1


def test_none_ready_tells_every_worker_to_prefill_locally() -> None:
    fake = FakeDecodeWorkers({"10.0.0.1": ["10.1.0.9:8000"], "10.0.0.2": []})
    assert run_push(fake, ()).errors == {}
    assert fake.puts == {"10.0.0.1": {"endpoints": []}}


def test_refusals_and_unreachable_workers_are_the_rounds_errors() -> None:
    fake = FakeDecodeWorkers({"10.0.0.1": 401, "10.0.0.2": "down", "10.0.0.3": 404})
    outcome = run_push(fake, ("10.1.0.1:8000",))
    assert (outcome.num_in_sync, outcome.num_targets) == (0, 3)
    assert outcome.errors["w-10.0.0.1"].startswith("HTTP 401")
    assert outcome.errors["w-10.0.0.2"].startswith("ConnectError")
    assert outcome.errors["w-10.0.0.3"].startswith("HTTP 404")  # a worker without P/D
    # Unreadable, so each was told (and refused): one GET and one PUT each.
    assert sorted(method for method, _, _ in fake.calls) == ["GET"] * 3 + ["PUT"] * 3


def test_a_round_tells_the_ready_prefill_pods_and_nothing_without_a_tier() -> None:
    async def scenario(spec: dict[str, Any], fake: FakeDecodeWorkers) -> PrefillRound | None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(fake)) as http:
            gen = [PodTarget("chat-worker-0", "10.0.0.1", "")]
            prefill = [PodTarget("chat-prefill-1", "10.1.0.2", ""),
                       PodTarget("chat-prefill-0", "10.1.0.10", "")]  # fmt: skip
            workers = WorkerClient(http, TOKEN)
            return await prefill_round(workers, GenPoolSpec.from_body(spec), gen, prefill)

    fake = FakeDecodeWorkers({"10.0.0.1": []})
    assert asyncio.run(scenario({}, fake)) is None and fake.calls == []
    done = asyncio.run(scenario({"prefill": {"replicas": 2}}, fake))
    assert done is not None
    assert done.to_status() == {
        "endpoints": ["10.1.0.10:8000", "10.1.0.2:8000"], "decodeInSync": "1/1",
    }  # fmt: skip


# ---- the endpoints the decode workers are told ---------------------------------------------


def test_endpoints_are_sorted_ip_port_and_ipv6_is_bracketed() -> None:
    assert prefill_endpoints(["10.0.0.9", "10.0.0.10"]) == ("10.0.0.10:8000", "10.0.0.9:8000")
    assert endpoint("fd00::5") == "[fd00::5]:8000"
    assert prefill_endpoints([]) == ()


@pytest.mark.parametrize(
    ("reported", "wanted", "push"),
    [
        (["a:1", "b:1"], ["a:1", "b:1"], False),
        (["b:1", "a:1"], ["a:1", "b:1"], False),  # the order is the worker's round robin
        (["a:1"], ["a:1", "b:1"], True),  # a new prefill pod
        (["a:1", "gone:1"], ["a:1"], True),  # one left
        ([], [], False),
        (["a:1"], [], True),  # none ready: local prefills, no dead endpoint
        (None, ["a:1"], True),  # unreadable: tell it again
        (None, [], True),
    ],
)
def test_a_worker_is_told_when_it_reports_another_set(
    reported: list[str] | None, wanted: list[str], push: bool
) -> None:
    assert needs_push(reported, wanted) is push


def test_get_prefillers_bodies() -> None:
    assert parse_endpoints({"endpoints": ["a:1"]}) == ["a:1"]
    assert parse_endpoints({"endpoints": []}) == []
    for bad in (None, [], {"endpoints": "a:1"}, {"endpoints": [1]}, {}):
        assert parse_endpoints(bad) is None


def test_the_rounds_record_and_event() -> None:
    done = PrefillRound(("10.0.0.1:8000",), PushOutcome(2, 2))
    assert done.to_status() == {"endpoints": ["10.0.0.1:8000"], "decodeInSync": "2/2"}
    assert done.events() == []
    failed = PrefillRound((), PushOutcome(1, 2, {"chat-worker-1": "HTTP 404: not found"}))
    assert failed.to_status()["decodeInSync"] == "1/2"
    (event,) = failed.events()
    assert (event.type, event.reason) == ("Warning", PREFILLERS_PUSH_FAILED)
    assert event.message == "chat-worker-1: HTTP 404: not found"


# ---- status.prefill ------------------------------------------------------------------------


def test_the_mirror_records_the_prefill_statefulsets_counts() -> None:
    sts = {"spec": {"replicas": 2}, "status": {"replicas": 2, "readyReplicas": 1}}
    counts = PrefillCounts.from_statefulset(sts)
    patch = mirror_patch({}, counts, has_prefill=True)
    assert patch == {"prefill": {"desired": 2, "replicas": 2, "readyReplicas": 1, "ready": "1/2"}}
    recorded = {"prefill": {**patch["prefill"], "endpoints": ["a:1"], "decodeInSync": "1/1"}}
    assert mirror_patch(recorded, counts, has_prefill=True) is None  # no news
    assert mirror_patch(recorded, counts, has_prefill=False) == {"prefill": None}
    assert mirror_patch({}, counts, has_prefill=False) is None


def test_a_reconcile_starts_or_drops_status_prefill() -> None:
    start = spec_patch({}, Prefill(replicas=2))
    assert start == {"prefill": {"desired": 2, "replicas": 0, "readyReplicas": 0, "ready": "0/2"}}
    assert spec_patch(start, Prefill(replicas=2)) == {}  # the mirror's from now on
    assert spec_patch(start, None) == {"prefill": None}
    assert spec_patch({}, None) == {}
