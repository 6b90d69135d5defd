"""Replicas that come and go: start-up, draining, replica-seconds, per-seed open-loop
arrivals, the policies and ``genpool sim --autoscale``."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import fields, replace
from pathlib import Path

import pytest

from genpool_core.knobs import KnobBounds
from genpool_core.scaler import ScalerSettings
from genpool_core.stepmodel import StepModel
from genpool_sim import cli
from genpool_sim.autoscale import AutoscaleConfig, policy_pool, run_policy, slo_windows
from genpool_sim.cluster import Cluster, ClusterConfig
from genpool_sim.experiment import Workload, simulate
from genpool_sim.pool_control import TuneConfig
from genpool_sim.records import SimRequest
from genpool_sim.workload import (
    RatePhase,
    TraceRequest,
    gamma_arrivals,
    parse_rate_phases,
    phased_gamma_arrivals,
)

FLAT = StepModel(
    t0_s=0.1, per_request_s=0.0, per_context_token_s=0.0,
    prefill_base_s=0.1, prefill_per_token_s=0.0,
)  # fmt: skip


def _ignore(_: object) -> None:
    """A tick callback returns nothing."""


LENGTHS = [TraceRequest(0.0, 100 + 7 * i, 20 + 13 * i % 60) for i in range(50)]


def test_open_loop_seeds_draw_their_own_arrivals_and_lengths() -> None:
    workload = Workload(LENGTHS, rate_phases=[RatePhase(60.0, 4.0)], cv=1.5, warmup_s=5.0)
    config = ClusterConfig(workers=2, max_batch=8)
    first, second = simulate(config, workload, 0), simulate(config, workload, 1)
    key = [(r.arrival, r.output_tokens) for r in first.requests.values()]
    assert key != [(r.arrival, r.output_tokens) for r in second.requests.values()]
    assert key == [
        (r.arrival, r.output_tokens) for r in simulate(config, workload, 0).requests.values()
    ]
    # seed 0 is what the single --rate run drew before each seed had its own
    old = gamma_arrivals(4.0, 1.5, LENGTHS, random.Random(0), duration_s=60.0)
    assert key == [(r.arrival_s, r.output_tokens) for r in old]


def test_rate_phases_parse_and_shape_the_arrivals() -> None:
    phases = parse_rate_phases("100:2, 100:6,50:0")
    assert phases == [RatePhase(100.0, 2.0), RatePhase(100.0, 6.0), RatePhase(50.0, 0.0)]
    arrivals = phased_gamma_arrivals(phases, 1.0, LENGTHS, random.Random(3))
    low = sum(1 for r in arrivals if r.arrival_s < 100)
    high = sum(1 for r in arrivals if 100 <= r.arrival_s < 200)
    assert 120 < low < 280 and 450 < high < 750 and all(r.arrival_s < 200 for r in arrivals)
    for bad in ("100", "x:2", "0:2", "100:-1", "100:0", "100:nan"):
        with pytest.raises(ValueError, match="phase"):
            parse_rate_phases(bad)


def test_a_new_worker_serves_after_its_start_up_and_counts_from_its_start() -> None:
    cluster = Cluster(ClusterConfig(workers=1, max_batch=1, ctx_servers=4, step_model=FLAT))
    cluster.at(1.0, lambda now: _ignore(cluster.add_worker(startup_delay_s=10.0)))
    for i in range(4):  # all land on worker 0 while worker 1 loads its model
        cluster.submit(SimRequest(f"a{i}", 2.0, 10, 50))
    cluster.submit(SimRequest("late", 12.0, 10, 5))  # worker 1 is ready and idle
    cluster.run()
    assert {r.worker for r in cluster.requests.values() if r.request_id != "late"} == {0}
    assert cluster.requests["late"].worker == 1
    assert cluster.replica_seconds(0.0, 20.0) == pytest.approx(20.0 + 19.0)
    assert cluster.replica_seconds(5.0, 20.0) == pytest.approx(15.0 + 15.0)
    assert cluster.requests["a3"].gen_ttft == pytest.approx(3 * 4.9 + 0.1)  # queued on 0


def test_a_drained_worker_finishes_its_residents_and_returns_its_waiters() -> None:
    cluster = Cluster(ClusterConfig(workers=2, max_batch=1, ctx_servers=8, step_model=FLAT))
    for i in range(6):  # three per worker: one resident each, two waiting each
        cluster.submit(SimRequest(f"r{i}", 0.0, 10, 11))
    removed: list[int] = []
    cluster.at(0.5, lambda now: removed.append(cluster.remove_worker().index))  # type: ignore[union-attr]
    cluster.run()
    assert removed == [1]
    on_one = [r for r in cluster.requests.values() if r.worker == 1]
    assert len(on_one) == 1 and on_one[0].first_gen_token is not None  # the resident stayed
    assert all(r.is_done for r in cluster.requests.values())
    drained = cluster.workers[1]
    assert drained.retired_at == pytest.approx(on_one[0].last_token)
    # returned waiters keep their GEN arrival: their TTFT includes the wait on worker 1
    assert max(r.gen_ttft or 0.0 for r in cluster.requests.values()) > 4.0
    assert cluster.remove_worker() is None  # the last routable worker stays


def test_removing_a_starting_worker_cancels_it() -> None:
    cluster = Cluster(ClusterConfig(workers=1, step_model=FLAT))
    cluster.at(1.0, lambda now: _ignore(cluster.add_worker(60.0)))
    cluster.at(5.0, lambda now: _ignore(cluster.remove_worker()))
    cluster.run()
    assert not cluster.workers[1].is_ready and cluster.workers[1].retired_at == 5.0
    assert cluster.replica_seconds(0.0, 10.0) == pytest.approx(10.0 + 4.0)


AUTO = AutoscaleConfig(slo_ttft_p90_s=1.0, target_output_tps=5.0, min_replicas=1,
                       max_replicas=6, startup_delay_s=10.0, interval_s=10.0)  # fmt: skip
TUNE = TuneConfig(KnobBounds(0, 4, 0, 4), interval_s=10.0)
STEP = Workload(LENGTHS, rate_phases=[RatePhase(60.0, 1.0), RatePhase(120.0, 8.0)],
                warmup_s=10.0)  # fmt: skip
BASE = ClusterConfig(workers=4, max_batch=4, ctx_servers=8, step_model=FLAT)


def test_static_counts_its_fixed_pool_and_the_scalers_follow_the_load() -> None:
    static = run_policy("static", BASE, STEP, 0, AUTO, TUNE)
    assert static.metrics["replica_seconds"] == pytest.approx(4 * 170.0)
    assert {e["ready"] for e in static.timeline} == {4}
    for policy in ("replicas-only", "genpool"):
        run = run_policy(policy, BASE, STEP, 0, AUTO, TUNE)
        ready = [int(str(e["ready"])) for e in run.timeline]
        assert ready[0] == 1 and max(ready) >= 3, (policy, run.timeline)
        assert any(str(e["reason"]).startswith("up-") for e in run.timeline)
        assert 0 <= run.metrics["slo_windows_met"] <= 1
        assert run.metrics["replica_seconds"] < 6 * 170.0


def test_both_scaled_policies_run_the_same_law_at_its_defaults() -> None:
    auto = AutoscaleConfig(slo_ttft_p90_s=1.0, target_output_tps=5.0, min_replicas=1,
                           max_replicas=4, startup_delay_s=45.0)  # fmt: skip
    planner = auto.scaler_settings(16, is_pausing=False)
    genpool = auto.scaler_settings(16)
    assert replace(planner, is_pausing=True) == genpool  # pausing is the only difference
    defaults = ScalerSettings(ttft_p90_s=1.0, min_replicas=1, max_replicas=4, max_batch=16)
    law = {f.name for f in fields(ScalerSettings)} - {
        "ttft_p90_s",
        "min_replicas",
        "max_replicas",
        "max_batch",
        "is_pausing",
        "startup_s",
        "interval_s",
    }
    assert all(getattr(genpool, name) == getattr(defaults, name) for name in law)
    assert genpool.startup_s == 45.0  # the scaler is told the start-up the pool has
    pinned = replace(auto, capacity_override=0.6).scaler_settings(16)
    assert pinned.capacity_override == 0.6
    with pytest.raises(ValueError, match="shares"):
        AutoscaleConfig(slo_ttft_p90_s=1.0, target_output_tps=5.0, min_replicas=1,
                        max_replicas=4, capacity_override=1.2)  # fmt: skip


def test_the_pausing_policies_start_their_knobs_as_a_slo_genpool_does() -> None:
    base = ClusterConfig(workers=2, max_batch=16)
    tune = TuneConfig(KnobBounds(0, 16, 0, 16))
    for policy in ("static", "genpool"):
        config, _ = policy_pool(policy, base, AUTO, tune)
        assert (config.settings()["paused_cap"], config.settings()["resident_headroom"]) == (
            16,
            16,
        ), policy
    off, _ = policy_pool("replicas-only", base, AUTO, tune)
    assert "paused_cap" not in off.settings()


def test_slo_windows_check_both_parts_per_window() -> None:
    cluster = Cluster(ClusterConfig(workers=1, step_model=FLAT))
    fast = SimRequest("fast", 0.0, 10, 11, gen_arrival=1.0, first_gen_token=1.5,
                      first_token_time=1.0, last_token=2.0)  # fmt: skip
    slow_ttft = SimRequest("slow", 60.0, 10, 11, gen_arrival=61.0, first_gen_token=64.0,
                           first_token_time=61.0, last_token=65.0)  # fmt: skip
    slow_rate = SimRequest("rate", 120.0, 10, 11, gen_arrival=121.0, first_gen_token=121.5,
                           first_token_time=121.0, last_token=170.0)  # fmt: skip
    for request in (fast, slow_ttft, slow_rate):
        cluster.requests[request.request_id] = request
    auto = AutoscaleConfig(slo_ttft_p90_s=1.0, target_output_tps=5.0, min_replicas=1,
                           max_replicas=2, attainment=0.5)  # fmt: skip
    assert slo_windows(cluster, auto, 0.0, 240.0) == [True, False, False, True]


def _trace(tmp_path: Path) -> Path:
    trace = tmp_path / "t.csv"
    rows = "\n".join(f"0,{100 + i},{20 + 13 * i % 60}" for i in range(50))
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows + "\n")
    return trace


def test_cli_autoscale_writes_the_summary_per_seed_and_timeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "a.json"
    code = cli.main(["sim", "--trace", str(_trace(tmp_path)), "--autoscale",
                     "--rate-phases", "40:2,60:8", "--workers", "4", "--max-batch", "4",
                     "--slo-ttft-p90", "1", "--target-output-tps", "5", "--min-replicas", "1",
                     "--max-replicas", "6", "--startup-delay", "10", "--scale-interval", "10",
                     "--warmup", "10", "--seeds", "2", "--jobs", "1", "--json", str(out),
                     "--plot", str(tmp_path / "plots")])  # fmt: skip
    assert code == 0
    assert "SLO windows met" in capsys.readouterr().out
    run = json.loads(out.read_text())["runs"][0]
    assert set(run["summary"]) == {"static", "replicas-only", "genpool", "llm-d-slo"}
    for metrics in run["summary"].values():
        for name in ("replica_seconds", "slo_windows_met", "ttft_p90", "below_target",
                     "tpot_mean", "output_tokens_per_s"):  # fmt: skip
            assert set(metrics[name]) == {"mean", "ci95"}
    assert len(run["per_seed"]) == 8 and set(run["timeline_seed0"]) == set(run["summary"])
    assert (tmp_path / "plots" / "autoscale.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--rate-phases", "40:x"], "--rate-phases"),
        (["--rate-phases", "40:2", "--duration", "50"], "--rate-phases"),
        (["--min-replicas", "5", "--max-replicas", "3"], "--min-replicas"),
        (["--startup-delay", "-1"], "--startup-delay"),
        (["--slo-ttft-p90", "0"], "--slo-ttft-p90"),
        (["--policies", "static,bogus"], "--policies"),
        (["--target-output-tps", "auto"], "--target-output-tps"),
        (["--capacity-override", "0"], "--capacity-override"),
        (["--capacity-override", "1.5"], "--capacity-override"),
        (["--capacity-override", "x"], "--capacity-override"),
        (["--policies", "oracle"], "--schedule"),
        (["--policies", "oracle", "--schedule", "0:2,10:x"], "--schedule"),
        (["--policies", "oracle", "--schedule", "5:2"], "--schedule"),
        (["--paused-cap-fraction", "0.5"], "--paused-cap-fraction"),
    ],
)
def test_cli_autoscale_bad_input_is_one_line_naming_the_flag(
    argv: list[str], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    defaults = {"--rate-phases": "100:2", "--slo-ttft-p90": "1", "--target-output-tps": "5"}
    for name, value in defaults.items():
        if name not in argv:
            argv = [*argv, name, value]
    assert cli.main(["sim", "--trace", str(_trace(tmp_path)), "--autoscale", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("genpool: error: ") and flag in err


def test_the_oracle_serves_each_phase_from_its_first_second_and_pays_the_start_up() -> None:
    auto = replace(AUTO, schedule=((0.0, 1), (60.0, 3), (150.0, 1)))
    run = run_policy("oracle", BASE, STEP, 0, auto, TUNE)
    # 1 replica over [10, 180), 2 more from 50 (ready at 60) until 150, then draining
    assert 170.0 + 2 * 100.0 <= run.metrics["replica_seconds"] <= 170.0 + 2 * 115.0
    changes = [(e["t"], e["desired"]) for e in run.timeline if e["reason"] == "schedule"]
    assert changes == [(50.0, 3), (150.0, 1)]
    with pytest.raises(ValueError, match="schedule"):
        run_policy("oracle", BASE, STEP, 0, AUTO, TUNE)


def test_llm_d_slo_scales_on_the_tail_and_holds_its_hpa_windows() -> None:
    run = run_policy("llm-d-slo", BASE, STEP, 0, AUTO, TUNE)
    desired = [int(str(e["desired"])) for e in run.timeline]
    assert desired[0] == 1 and max(desired) > 1
    ups = [e for e in run.timeline if e["reason"] == "up"]
    assert ups and all(float(str(e["signal"])) > 0.55 for e in ups)
    # down one replica at a time, 120 s apart at most
    downs = [float(str(e["t"])) for e in run.timeline if e["reason"] == "down"]
    assert all(b - a >= 120.0 for a, b in itertools.pairwise(downs))


def test_a_pool_that_served_before_starts_from_what_its_scaler_learned() -> None:
    learned = replace(AUTO, learn_days=1)
    cold = run_policy("genpool", BASE, STEP, 0, AUTO, TUNE)
    warm = run_policy("genpool", BASE, STEP, 0, learned, TUNE)
    first = next(e for e in warm.timeline if e.get("inputs"))["inputs"]
    cold_first = next(e for e in cold.timeline if e.get("inputs"))["inputs"]
    assert isinstance(first, dict) and isinstance(cold_first, dict)
    # the cold pool's service time is its first window's; the warm one's is yesterday's,
    # smoothed with it
    assert first["service_s"] is not None and first["service_s"] != cold_first["service_s"]
