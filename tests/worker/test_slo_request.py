"""Per-request SLOs from llm-d's headers and the body's ``slo`` extension."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from genpool_worker.api import CompletionRequest
from genpool_worker.generation import make_arrival
from genpool_worker.http_common import ApiError, ServerContext
from genpool_worker.metrics import WorkerMetrics
from genpool_worker.slo_request import TPOT_HEADER, TTFT_HEADER, RequestSlo, request_slo


def test_headers_give_d_i_and_t_i() -> None:
    slo = request_slo({TTFT_HEADER: "250", TPOT_HEADER: "40"}, None)
    assert slo == RequestSlo(ttft_s=0.25, target_output_tps=25.0)  # T_i = 1000 / tpot_ms
    assert request_slo({}, None) == RequestSlo()
    assert request_slo({TPOT_HEADER: " 12.5 "}, None).target_output_tps == 80.0


def test_the_body_overrides_a_header_field_by_field() -> None:
    slo = request_slo({TTFT_HEADER: "250", TPOT_HEADER: "40"}, {"tpot_ms": 100})
    assert slo == RequestSlo(ttft_s=0.25, target_output_tps=10.0)
    assert request_slo({}, {"ttft_ms": 1500.0, "tpot_ms": None}).ttft_s == 1.5


@pytest.mark.parametrize(
    ("headers", "body", "named"),
    [
        ({TTFT_HEADER: "fast"}, None, TTFT_HEADER),
        ({TTFT_HEADER: ""}, None, TTFT_HEADER),
        ({TPOT_HEADER: "0"}, None, TPOT_HEADER),
        ({TPOT_HEADER: "-5"}, None, TPOT_HEADER),
        ({TPOT_HEADER: "nan"}, None, TPOT_HEADER),
        ({TTFT_HEADER: "inf"}, None, TTFT_HEADER),
        ({TTFT_HEADER: "1e400"}, None, TTFT_HEADER),
        ({TTFT_HEADER: "3600001"}, None, TTFT_HEADER),
        ({}, {"ttft_ms": "soon"}, "slo.ttft_ms"),
        ({}, {"ttft_ms": True}, "slo.ttft_ms"),
        ({}, {"tpot_ms": 0}, "slo.tpot_ms"),
        ({}, {"tpot_ms": [5]}, "slo.tpot_ms"),
        ({}, {"tpot_ms": 1e12}, "slo.tpot_ms"),
        ({}, {"ttft_ms": 10**400}, "slo.ttft_ms"),  # the fuzz bench found it a 500
        ({}, {"ttft": 100}, "slo.ttft"),
    ],
)
def test_a_bad_value_is_a_400_naming_it(
    headers: dict[str, str], body: dict[str, object] | None, named: str
) -> None:
    with pytest.raises(ApiError) as caught:
        request_slo(headers, body)
    assert caught.value.status == 400 and named in caught.value.message


def fake_context(max_seq_len: int = 100) -> ServerContext:
    engine = SimpleNamespace(model_info=SimpleNamespace(max_seq_len=max_seq_len))
    metrics = WorkerMetrics("synthetic:test", is_synthetic=True)
    return cast(ServerContext, SimpleNamespace(engine=engine, stamp_arrival=False,
                                               max_arrival_age_s=5.0, metrics=metrics))  # fmt: skip


def test_the_arrival_carries_the_request_slo() -> None:
    body = CompletionRequest.model_validate({"prompt": "x", "slo": {"ttft_ms": 500}})
    headers: dict[str, Any] = {TPOT_HEADER: "50"}
    arrival = make_arrival(fake_context(), body, [1, 2], 8, headers, id_prefix="cmpl")
    assert (arrival.slo_ttft_s, arrival.target_output_tps) == (0.5, 20.0)
    plain = make_arrival(fake_context(), body.model_copy(update={"slo": None}), [1], 8, {},
                         id_prefix="cmpl")  # fmt: skip
    assert (plain.slo_ttft_s, plain.target_output_tps) == (None, None)
    # With the worker's stamping off, a request that states its own SLO is keyed anyway.
    assert arrival.arrival_time is not None and plain.arrival_time is None
