"""The demo's phased load plan, per-phase numbers, table, events and pool specs (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from genpool_devcluster import demo
from genpool_devcluster.demo_load import (
    LENGTH_MIX,
    Phase,
    PlannedRequest,
    SentRequest,
    phase_bounds,
    plan_arrivals,
)
from genpool_devcluster.demo_plot import write_plot
from genpool_devcluster.demo_report import (
    delivered_tokens,
    format_events,
    format_table,
    phase_rows,
    ttft_p90_series,
)
from genpool_devcluster.loadgen import RequestResult
from genpool_operator.spec import GenPoolSpec

PHASES = (Phase("quiet", 100, 1.0), Phase("burst", 50, 8.0), Phase("after", 100, 0.0))


def sent(
    at: float, phase: str, ttft: float, e2e: float, tokens: int, ok: bool = True
) -> SentRequest:
    planned = PlannedRequest(at, phase, "p", tokens)
    result = RequestResult(ok, "pod", ttft if ok else None, e2e, tokens if ok else 0, 0)
    return SentRequest(planned, result)


def test_phase_bounds_are_back_to_back() -> None:
    assert phase_bounds(PHASES) == [("quiet", 0, 100), ("burst", 100, 150), ("after", 150, 250)]


def test_plan_is_seeded_sorted_and_follows_the_rates() -> None:
    plan = plan_arrivals(PHASES, seed=3)
    assert plan == plan_arrivals(PHASES, seed=3)
    assert plan != plan_arrivals(PHASES, seed=4)
    assert [p.at_s for p in plan] == sorted(p.at_s for p in plan)
    counts = {name: sum(p.phase == name for p in plan) for name, _, _ in phase_bounds(PHASES)}
    # Poisson counts: 100 and 400 expected; a zero rate sends nothing.
    assert 60 < counts["quiet"] < 140 and 320 < counts["burst"] < 480 and counts["after"] == 0
    for p in plan:
        start, end = next((s, e) for n, s, e in phase_bounds(PHASES) if n == p.phase)
        assert start <= p.at_s < end
    assert {p.max_tokens for p in plan} == {length for length, _ in LENGTH_MIX}


def test_delivered_tokens_spread_over_each_stream() -> None:
    # 10 tokens streamed from t=12 to t=22: 8 of them fall in [0, 20).
    one = [sent(10, "quiet", 2, 12, 10)]
    assert delivered_tokens(one, 0, 20) == pytest.approx(8.0)
    assert delivered_tokens(one, 20, 40) == pytest.approx(2.0)
    assert delivered_tokens([sent(10, "quiet", 2, 12, 10, ok=False)], 0, 40) == 0


def test_phase_rows_count_latency_attainment_and_replicas() -> None:
    requests = [
        sent(10, "quiet", 0.5, 2.5, 21),  # 20 tokens in 2 s after the first: 10 tok/s
        sent(20, "quiet", 1.5, 11.5, 21),  # 2 tok/s: below T = 5
        sent(110, "burst", 4.0, 5.0, 11),
        sent(120, "burst", 9.0, 9.0, 0, ok=False),
    ]
    replicas = [(0.0, 1), (50.0, 1), (110.0, 2), (140.0, 3), (200.0, 1)]
    rows = phase_rows(requests, phase_bounds(PHASES), 5.0, replicas)
    quiet, burst, after = rows["quiet"], rows["burst"], rows["after"]
    assert list(rows) == ["quiet", "burst", "after"]
    assert (quiet["requests"], quiet["failed"], quiet["attainment"]) == (2, 0, 0.5)
    assert quiet["ttft_p50_s"] == pytest.approx(1.0)
    assert quiet["tpot_mean_s"] == pytest.approx((0.1 + 0.5) / 2)
    assert quiet["tokens_per_s"] == pytest.approx(42 / 100)
    assert (quiet["replicas_max"], burst["replicas_max"], after["replicas_max"]) == (1, 3, 1)
    assert burst["replicas_mean"] == pytest.approx(2.5)
    assert (burst["requests"], burst["failed"], burst["attainment"]) == (2, 1, 1.0)
    assert after["requests"] == 0 and after["ttft_p90_s"] is None


def test_format_table_puts_pools_side_by_side_per_phase() -> None:
    row = {"requests": 3, "failed": 0, "ttft_p90_s": 1.23456, "attainment": 0.875}
    table = format_table({"auto": {"a": row, "b": row}, "static": {"a": row, "b": {}}}, ["a", "b"])
    lines = table.splitlines()
    assert lines[1].split() == ["auto", "static", "auto", "static"]
    assert lines[3].split() == ["failed", "0", "0", "0", "-"]
    assert "1.235" in table and "88%" in table


def test_ttft_series_bins_by_send_time() -> None:
    requests = [sent(1, "q", 1.0, 2, 3), sent(9, "q", 3.0, 4, 3), sent(12, "q", 5.0, 6, 3)]
    assert ttft_p90_series(requests, 10.0) == [(5.0, pytest.approx(2.8)), (15.0, 5.0)]


def test_format_events_keeps_decisions_in_time_order() -> None:
    events = [
        {"reason": "ScaledDown", "message": "3 -> 1", "lastTimestamp": "2026-01-01T00:05:00Z"},
        {"reason": "ChildrenApplied", "message": "x", "lastTimestamp": "2026-01-01T00:00:00Z"},
        {"reason": "ScaledUp", "message": "1 -> 3", "lastTimestamp": "2026-01-01T00:01:00Z"},
    ]
    lines = format_events(events, ("ScaledUp", "ScaledDown"))
    assert [line.split()[1] for line in lines] == ["ScaledUp", "ScaledDown"]


def test_demo_pools_are_valid_genpools_that_differ_only_where_meant() -> None:
    specs = demo.pool_specs()
    auto, static = (GenPoolSpec.model_validate(specs[n]) for n in (demo.AUTO, demo.STATIC))
    assert auto.autoscaling.enabled and auto.autoscaling.max_replicas == 3
    assert auto.slo is not None and auto.slo.ttft_p90_seconds == demo.SLO_TTFT_S
    assert not static.autoscaling.enabled and static.preemption.mode == "Off"
    assert auto.engine == static.engine and auto.model == static.model


def test_write_plot_writes_a_png(tmp_path: Path) -> None:
    series = {"auto": [(5.0, 0.4), (15.0, 3.0)], "static": [(5.0, 0.5), (15.0, 20.0)]}
    replicas = {"auto": [(0.0, 1), (10.0, 3)], "static": [(0.0, 1), (10.0, 1)]}
    path = write_plot(
        series, replicas, phase_bounds(PHASES), {"burst"}, 1.5, tmp_path / "d" / "p.png"
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
