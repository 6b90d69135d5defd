"""The keying rule (docs/design.md#keyed-by-default): who says when a request arrived, and
the header's bad values. Pure: the worker's HTTP-free half, no torch."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from genpool_operator.spec import GenPoolSpec
from genpool_worker.api import ARRIVAL_SKEW_TOLERANCE_S, GenPoolTiming
from genpool_worker.arrival_key import (
    ARRIVAL_HEADER,
    DEFAULT_MAX_ARRIVAL_AGE_S,
    ArrivalKey,
    arrival_key,
)
from genpool_worker.http_common import ApiError
from genpool_worker.worker_args import build_parser
from genpool_worker.worker_config import WorkerConfig

NOW = 1_800_000_000.0


def keyed(
    timing: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    *,
    own_slo: bool = False,
    stamp: bool = True,
    max_age_s: float = 3600.0,
) -> ArrivalKey:
    return arrival_key(
        None if timing is None else GenPoolTiming.model_validate(timing),
        headers or {},
        has_own_slo=own_slo,
        stamp_arrival=stamp,
        now=NOW,
        max_age_s=max_age_s,
    )


def key(
    timing: dict[str, Any] | None = None, headers: dict[str, str] | None = None, **kw: Any
) -> float | None:
    return keyed(timing, headers, **kw).time


def test_a_request_with_no_stamp_is_keyed_with_its_receipt() -> None:
    assert key() == NOW
    assert key({}) == NOW
    assert key({"first_token_time": NOW - 1}) == NOW


def test_the_routers_header_wins_over_the_body_which_wins_over_receipt() -> None:
    # A client writes the body; a gateway that stamps overwrites the header (issue 33).
    both = keyed({"arrival_time": NOW - 3}, {ARRIVAL_HEADER: str(NOW - 7)})
    assert (both.time, both.source) == (NOW - 7, "header")
    body = keyed({"arrival_time": NOW - 3})
    assert (body.time, body.source) == (NOW - 3, "body")
    assert key(None, {ARRIVAL_HEADER: f"{NOW - 7:.3f}"}) == NOW - 7
    assert key(None, {ARRIVAL_HEADER: " 1800000000 "}) == NOW
    receipt = keyed()
    assert (receipt.time, receipt.source, receipt.is_clamped) == (NOW, "receipt", False)


def test_a_stamp_older_than_the_max_age_is_clamped_to_it() -> None:
    # {"genpool": {"arrival_time": 0}} jumped the queue, was at risk at once and set
    # the stat line's ttft_p90 to decades: now it is as old as the bound allows, no older.
    for timing, headers, source in [({"arrival_time": 0}, {}, "body"),
                                    (None, {ARRIVAL_HEADER: "0"}, "header")]:  # fmt: skip
        clamped = keyed(timing, headers, max_age_s=DEFAULT_MAX_ARRIVAL_AGE_S)
        assert clamped.time == NOW - DEFAULT_MAX_ARRIVAL_AGE_S
        assert (clamped.source, clamped.is_clamped) == (source, True)
    inside = keyed({"arrival_time": NOW - 1}, max_age_s=DEFAULT_MAX_ARRIVAL_AGE_S)
    assert (inside.time, inside.is_clamped) == (NOW - 1, False)
    assert WorkerConfig().max_arrival_age_s == DEFAULT_MAX_ARRIVAL_AGE_S
    with pytest.raises(ValueError, match="max_arrival_age_s"):
        WorkerConfig(max_arrival_age_s=0)


def test_unkeyed_only_when_asked_or_when_stamping_is_off_and_no_slo_is_stated() -> None:
    assert key({"keyed": False}) is None
    assert key({"keyed": False}, {ARRIVAL_HEADER: str(NOW)}) is None  # the client knows best
    assert key({"keyed": True}) == NOW
    assert key(stamp=False) is None
    assert key(stamp=False, own_slo=True) == NOW  # a TTFT/TPOT target needs a clock
    assert key(None, {ARRIVAL_HEADER: str(NOW - 2)}, stamp=False) == NOW - 2


def test_keyed_false_with_an_arrival_is_a_contradiction() -> None:
    with pytest.raises(ApiError) as err:
        key({"keyed": False, "arrival_time": NOW})
    assert err.value.status == 422 and "genpool.keyed" in err.value.message


@pytest.mark.parametrize(
    "value", ["", "now", "1e400", "nan", "inf", "-1", "0x10", "1" * 60, "12,5"]
)
def test_a_malformed_header_is_a_400_naming_it(value: str) -> None:
    with pytest.raises(ApiError) as err:
        key(None, {ARRIVAL_HEADER: value})
    assert err.value.status == 400 and ARRIVAL_HEADER in err.value.message


def test_a_stamp_in_the_future_is_a_422_naming_its_source() -> None:
    ahead = NOW + ARRIVAL_SKEW_TOLERANCE_S + 1
    for timing, headers, source in [
        (None, {ARRIVAL_HEADER: str(ahead)}, ARRIVAL_HEADER),
        ({"arrival_time": ahead}, {}, "genpool.arrival_time"),
    ]:
        with pytest.raises(ApiError) as err:
            key(timing, headers)
        assert err.value.status == 422 and source in err.value.message
    # Within the skew tolerance a router's clock may run ahead of the worker's.
    assert key(None, {ARRIVAL_HEADER: str(NOW + 1)}) == NOW + 1


@given(st.text(max_size=80))
def test_any_header_value_is_a_time_or_a_4xx(value: str) -> None:
    try:
        got = key(None, {ARRIVAL_HEADER: value})
    except ApiError as exc:
        assert exc.status in (400, 422) and ARRIVAL_HEADER in exc.message
    else:
        assert got is not None and 0.0 <= got <= NOW + ARRIVAL_SKEW_TOLERANCE_S


def test_the_worker_stamps_by_default_and_a_flag_turns_it_off() -> None:
    assert WorkerConfig().stamp_arrival is True
    args = build_parser().parse_args(["--no-stamp-arrival"])
    assert args.stamp_arrival is False
    assert build_parser().parse_args([]).stamp_arrival is None  # not given: the config's


def test_the_operators_pools_stamp_unless_the_spec_turns_it_off() -> None:
    assert GenPoolSpec.from_body({}).worker_config()["stamp_arrival"] is True
    off = GenPoolSpec.from_body({"engine": {"stampArrival": False}}).worker_config()
    assert off["stamp_arrival"] is False
    with pytest.raises(ValueError, match=r"stampArrival|stamp_arrival"):
        GenPoolSpec.from_body({"engine": {"stampArrival": "yes"}})
