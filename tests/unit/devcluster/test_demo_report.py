"""The demo's phased load plan, per-phase numbers, table, events and pool specs (pure)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench import sim_demo_load
from genpool_core.scaler_settings import (
    DEFAULT_DOWN_WINDOW_S,
    DEFAULT_MAX_STEP,
    DEFAULT_UP_WINDOW_S,
)
from genpool_devcluster import demo, demo_pools
from genpool_devcluster.demo_load import (
    CLASSES,
    LENGTH_MIX,
    Phase,
    PlannedRequest,
    PoolSample,
    SentRequest,
    phase_bounds,
    plan_arrivals,
)
from genpool_devcluster.demo_plot import write_plot
from genpool_devcluster.demo_report import (
    delivered_tokens,
    format_events,
    format_inputs,
    format_table,
    phase_rows,
    replica_seconds,
    slo_windows,
    ttft_p90_series,
)
from genpool_devcluster.loadgen import RequestResult
from genpool_operator.scaling_plan import scaler_settings
from genpool_operator.spec import GenPoolSpec
from genpool_sim.autoscale_cli import autoscale_config
from genpool_sim.cli_options import build_parser
from genpool_worker.slo_request import TPOT_HEADER, TTFT_HEADER

PHASES = (Phase("quiet", 100, 1.0), Phase("burst", 50, 8.0), Phase("after", 100, 0.0))


def sent(
    at: float,
    phase: str,
    ttft: float,
    e2e: float,
    tokens: int,
    ok: bool = True,
    klass: str = "batch",
) -> SentRequest:
    planned = PlannedRequest(at, phase, "p", tokens, klass)
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
    share = sum(p.klass == "interactive" for p in plan) / len(plan)
    assert {p.klass for p in plan} == {c.name for c in CLASSES} and 0.2 < share < 0.4


def test_a_class_sends_its_own_slo_in_llm_ds_headers_and_nothing_private() -> None:
    interactive, batch = CLASSES
    assert interactive.headers() == {TTFT_HEADER: "1000", TPOT_HEADER: "50"}
    assert batch.headers() == {}


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
    replicas = [pool_at(0.0, 1), pool_at(50.0, 1), pool_at(110.0, 2, paused=4),
                pool_at(140.0, 3), pool_at(200.0, 1)]  # fmt: skip
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
    assert (quiet["paused_mean"], burst["paused_mean"]) == (0, 2)


def pool_at(t: float, ready: int, paused: int = 0, pods: int | None = None) -> PoolSample:
    return PoolSample(t, ready, ready if pods is None else pods, paused)


def test_attainment_is_per_class_each_at_its_own_floor() -> None:
    # 20 tokens in 1 s after the first: 20 tok/s meets the interactive floor (20) exactly;
    # 15 tok/s meets the pool's T (10) but not the interactive floor.
    requests = [
        sent(1, "quiet", 0.2, 1.2, 21, klass="interactive"),
        sent(2, "quiet", 3.0, 4.0 + 1 / 3, 21, klass="interactive"),
        sent(3, "quiet", 0.2, 1.0 + 1 / 3, 21),
    ]
    row = phase_rows(requests, phase_bounds(PHASES), 10.0, [])["quiet"]
    assert row["attainment_interactive"] == 0.5 and row["attainment_batch"] == 1.0
    assert row["attainment"] == pytest.approx(2 / 3)
    assert row["ttft_p90_s_interactive"] == pytest.approx(2.72)
    assert row["ttft_p90_s_batch"] == pytest.approx(0.2)


def test_replica_seconds_integrate_the_pods_that_exist() -> None:
    samples = [pool_at(0.0, 1), pool_at(10.0, 1, pods=3), pool_at(20.0, 2, pods=2)]
    assert replica_seconds(samples, 30.0) == pytest.approx(10 + 30 + 20)
    assert replica_seconds(samples, 15.0) == pytest.approx(10 + 15)
    assert replica_seconds([], 30.0) == 0.0


def test_slo_windows_need_the_ttft_the_attainment_and_no_failure() -> None:
    good = [sent(t, "quiet", 0.1, 1.1, 21) for t in (1, 2, 3)]  # window 0: met
    slow = [sent(t, "quiet", 3.0, 4.0, 21) for t in (11, 12)]  # window 1: TTFT misses
    crawl = [sent(t, "quiet", 0.1, 20.1, 21) for t in (21, 22)]  # window 2: 1 tok/s < T
    broken = [sent(31, "quiet", 0.1, 1.1, 21), sent(32, "quiet", 0, 1, 0, ok=False)]
    assert slo_windows(good + slow + crawl + broken, 10.0, 1.5, 0.8, 10.0) == (1, 4)


def test_the_cost_summary_compares_replica_seconds() -> None:
    runs = {
        demo_pools.GENPOOL: ([], [pool_at(0.0, 1), pool_at(50.0, 2)]),
        demo_pools.REPLICAS_ONLY: ([], [pool_at(0.0, 2)]),
    }
    cost = demo_pools.cost_summary(runs, 100.0)
    assert cost["pools"][demo_pools.GENPOOL]["replica_seconds"] == 150.0
    assert cost["pools"][demo_pools.REPLICAS_ONLY]["replica_seconds"] == 200.0
    assert cost["ratio"] == 0.75
    assert "0.750" in demo_pools.format_cost(cost) and "+25.0%" in demo_pools.format_cost(cost)


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


def test_demo_pools_run_the_scaler_at_its_defaults() -> None:
    for spec in demo_pools.pool_specs().values():
        auto = GenPoolSpec.model_validate(spec).autoscaling
        assert auto.target_utilization is None  # the capacity is learned
        assert auto.max_step == DEFAULT_MAX_STEP
        assert auto.scale_down_stabilization_seconds == DEFAULT_DOWN_WINDOW_S
        assert auto.scale_up_stabilization_seconds == DEFAULT_UP_WINDOW_S
        assert auto.startup_seconds == demo_pools.STARTUP_S  # the synthetic workers'


def test_the_simulated_demo_pools_run_the_law_the_live_ones_do(tmp_path: Path) -> None:
    argv = sim_demo_load.sim_argv(tmp_path / "t.csv", 1, 1, tmp_path / "o.json", 0.7)
    auto = autoscale_config(build_parser().parse_args(argv))
    assert auto.learn_days == 1 and auto.capacity_override is None
    assert auto.startup_delay_s == demo_pools.STARTUP_S
    specs = demo_pools.pool_specs(slo_ttft_s=0.7)
    for name, is_pausing in ((demo_pools.GENPOOL, True), (demo_pools.REPLICAS_ONLY, False)):
        spec = GenPoolSpec.model_validate(specs[name])
        live = scaler_settings(spec)
        simulated = auto.scaler_settings(spec.engine.max_batch_size, is_pausing=is_pausing)
        # The operator gives a pool in mode Off no attainment; the simulator gives it the
        # SLO's (its workers measure it only for requests with their own floor).
        assert simulated == replace(live, attainment=simulated.attainment), name
        assert simulated.attainment == live.attainment or not is_pausing


def test_demo_pools_are_valid_genpools_that_differ_only_where_meant() -> None:
    specs = demo_pools.pool_specs({demo_pools.REPLICAS_ONLY: 0.6})
    ours, theirs = (GenPoolSpec.model_validate(specs[n]) for n in demo_pools.POOLS)
    assert ours.slo == theirs.slo and ours.slo is not None
    assert ours.slo.ttft_p90_seconds == demo_pools.SLO_TTFT_S
    assert ours.preemption.mode == "TargetOutputTps" and theirs.preemption.mode == "Off"
    assert ours.autoscaling.enabled and ours.autoscaling.max_replicas == 3
    assert theirs.autoscaling.target_utilization == 0.6
    assert ours.autoscaling.target_utilization is None
    same = {"target_utilization"}
    assert ours.autoscaling.model_dump(exclude=same) == theirs.autoscaling.model_dump(exclude=same)
    assert ours.engine == theirs.engine and ours.model == theirs.model
    assert ours.tuning == theirs.tuning


@pytest.mark.parametrize("bad", ["genpool", "nope=0.5", "genpool=0", "genpool=1.5", "genpool=x"])
def test_a_bad_target_utilization_flag_is_refused(bad: str) -> None:
    with pytest.raises(SystemExit):
        demo._parse_args(["--target-utilization", bad])


@pytest.mark.parametrize("bad", ["0", "-1", "x", "4000", "nan"])
def test_a_bad_slo_flag_is_refused(bad: str) -> None:
    with pytest.raises(SystemExit):
        demo._parse_args(["--slo-ttft-p90", bad])


def test_the_flags_reach_both_pools_alike() -> None:
    args = demo._parse_args(["--slo-ttft-p90", "0.3", "--min-replicas", "1",
                             "--target-utilization", "replicas-only=0.6"])  # fmt: skip
    specs = demo_pools.pool_specs(
        dict(args.target_utilization), args.min_replicas, args.slo_ttft_p90
    )
    for spec in specs.values():
        assert spec["slo"]["ttftP90Seconds"] == 0.3 and spec["autoscaling"]["minReplicas"] == 1
    assert specs[demo_pools.REPLICAS_ONLY]["autoscaling"]["targetUtilization"] == 0.6
    assert "targetUtilization" not in specs[demo_pools.GENPOOL]["autoscaling"]


def test_format_inputs_shows_what_the_scalers_last_round_read() -> None:
    inputs = {"forecast": 5.2, "capacityPerReplica": 1.625, "capacity": 0.8125, "tail": 0.42,
              "pauseBudget": 3, "backlog": 0}  # fmt: skip
    line = format_inputs({"reason": "up-forecast", "inputs": inputs})
    assert line == (
        "scaler inputs (up-forecast): forecast 5.20 req/s, 1.62 req/s per replica (capacity"
        " 0.81, learned), tail 0.42, pause budget 3, backlog 0"
    )
    off = {k: v for k, v in inputs.items() if k not in ("pauseBudget", "tail")}
    line = format_inputs({"reason": "hold", "inputs": off}, pinned=0.6)
    assert "pause budget off" in line and "tail -," in line
    assert "pinned by targetUtilization 0.6" in line
    assert "none yet" in format_inputs({}) and "none yet" in format_inputs({"inputs": None})


def test_write_plot_writes_a_png(tmp_path: Path) -> None:
    series = {"auto": [(5.0, 0.4), (15.0, 3.0)], "static": [(5.0, 0.5), (15.0, 20.0)]}
    replicas = {"auto": [pool_at(0.0, 1), pool_at(10.0, 3, paused=2)], "static": [pool_at(0, 1)]}
    path = write_plot(
        series, replicas, phase_bounds(PHASES), {"burst"}, 1.5, tmp_path / "d" / "p.png"
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
