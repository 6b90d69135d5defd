"""Simulated workers with a KV budget: reservations in every pass, the gauge, the stat
lines the pool controller reads, the CLI's checks."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from genpool_core.knobs import KnobBounds
from genpool_core.plan import GenPlan
from genpool_core.scheduler import GenScheduler
from genpool_core.stepmodel import StepModel
from genpool_sim.cli import main
from genpool_sim.cluster import MODES, Cluster, ClusterConfig
from genpool_sim.experiment import Workload, run_seed, simulate
from genpool_sim.kv_memory import LLAMA_31_8B_BF16, KVGauge, _weighted_p99
from genpool_sim.pool_control import SimPool, TuneConfig
from genpool_sim.records import SimRequest
from genpool_sim.workload import TraceRequest
from tests.unit.support import check_invariants, write_small_trace

FLAT = StepModel(
    t0_s=0.125, per_request_s=0.0, per_context_token_s=0.0,
    prefill_base_s=0.5, prefill_per_token_s=0.0,
)  # fmt: skip
LENGTHS = [TraceRequest(0.0, 300 + 37 * i % 900, 20 + 53 * i % 300) for i in range(200)]
# 8 residents of up to ~1500 tokens need ~750 blocks of 16: 400 makes memory bind
TIGHT = ClusterConfig(workers=2, max_batch=8, target_output_tps=12.0, kv_blocks=400)


def test_llama_8b_shape_and_the_h200_budget() -> None:
    assert LLAMA_31_8B_BF16.bytes_per_token == 128 * 1024
    budget = LLAMA_31_8B_BF16.budget_for(108 * 10**9, 16)
    assert (budget.num_blocks, budget.block_size) == (51498, 16)
    assert LLAMA_31_8B_BF16.gb(8192 // 16, 16) == pytest.approx(1.0737, abs=1e-4)


@pytest.mark.parametrize("mode", MODES)
def test_every_pass_holds_its_reservations_when_memory_binds(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = GenScheduler.step

    def checked_step(self: GenScheduler, now: float) -> GenPlan:
        plan = original(self, now)
        check_invariants(self)  # blocks included: each resident holds its reservation
        return plan

    monkeypatch.setattr(GenScheduler, "step", checked_step)
    workload = Workload(LENGTHS, concurrency=80, duration_s=60.0, warmup_s=5.0)
    cluster = simulate(replace(TIGHT, mode=mode), workload, 1)
    assert all(request.is_done for request in cluster.requests.values())
    gen_tokens = sum(n for _, n in cluster.tokens_by_time)
    assert gen_tokens == sum(r.output_tokens - 1 for r in cluster.requests.values())
    for worker in cluster.workers:
        assert worker.scheduler.kv.num_used == 0  # every block given back
    assert cluster.kv_gauge is not None and cluster.kv_gauge.memory_bound_s > 0


def test_a_budget_that_never_binds_changes_no_decision() -> None:
    workload = Workload(LENGTHS, concurrency=60, duration_s=40.0, warmup_s=5.0)
    plain = ClusterConfig(mode="target_output_tps", workers=2, max_batch=8, target_output_tps=12)
    roomy = replace(plain, kv_blocks=10 * 8 * 80)  # B + H residents of the longest, 10 times
    first, second = simulate(plain, workload, 2), simulate(roomy, workload, 2)
    timeline = [(r.request_id, r.admitted, r.last_token, r.num_pauses)
                for r in first.requests.values()]  # fmt: skip
    assert timeline == [(r.request_id, r.admitted, r.last_token, r.num_pauses)
                        for r in second.requests.values()]  # fmt: skip
    assert sum(r.num_pauses for r in first.requests.values()) > 0
    assert first.kv_gauge is None and second.kv_gauge is not None


def test_the_gauge_weighs_each_pass_by_its_step_time() -> None:
    # Two requests of 2 blocks of 8 tokens each, a 2-block worker: b waits on memory while
    # a decodes (0.5-0.75), then runs (0.75-0.875).
    config = ClusterConfig(workers=1, max_batch=2, ctx_servers=2, step_model=FLAT,
                           kv_blocks=2, kv_block_size=8)  # fmt: skip
    cluster = Cluster(config)
    cluster.submit(SimRequest("a", 0.0, prompt_tokens=10, output_tokens=3))
    cluster.submit(SimRequest("b", 0.0, prompt_tokens=10, output_tokens=2))
    cluster.run()
    assert (cluster.requests["a"].admitted, cluster.requests["b"].admitted) == (0.5, 0.75)
    gauge = cluster.kv_gauge
    assert gauge is not None
    assert gauge.busy_s == pytest.approx(0.375)
    assert gauge.memory_bound_s == pytest.approx(0.25) and gauge.caps_bound_s == 0
    metrics = gauge.metrics(num_blocks=2, worker_s=1.0)
    assert metrics["kv_used_blocks_mean"] == pytest.approx(0.75)
    assert metrics["kv_used_share"] == pytest.approx(0.375)
    assert metrics["kv_memory_bound"] == pytest.approx(0.25)
    assert metrics["kv_paused_blocks_p99"] == 0.0


def test_the_paused_p99_is_over_time_idle_included() -> None:
    assert _weighted_p99({10: 0.495, 20: 0.005}, idle_s=0.5) == 10.0
    assert _weighted_p99({10: 0.98, 20: 0.02}, idle_s=0.0) == 20.0
    gauge = KVGauge(start=1.0, end=2.0)
    assert gauge.metrics(num_blocks=4, worker_s=0.0) == {}


def test_stat_lines_and_the_pool_controller_see_the_kv_fields() -> None:
    workload = Workload(LENGTHS, concurrency=80, duration_s=90.0, warmup_s=5.0)
    config = replace(TIGHT, mode="target_output_tps", max_resident_headroom=8, kv_blocks=2000)
    pool = SimPool(30.0, TuneConfig(KnobBounds(0, 8, 0, 8), interval_s=30.0))
    cluster = simulate(config, workload, 0, pool)
    lines = [line for _, line in cluster.stat_lines]
    assert lines and all(" kv=" in line and " kv_paused=" in line for line in lines)
    stats = [record["stats"] for record in pool.records if record["stats"] is not None]
    assert stats, "the tuner had rounds with stat lines"
    for status in stats:
        assert isinstance(status, dict)
        assert 0 < status["kvUsage"] <= 1 and 0 <= status["kvPausedShare"] <= status["kvUsage"]
    assert any(status["kvPausedShare"] > 0 for status in stats if isinstance(status, dict))


def test_runs_report_kv_metrics_only_with_a_budget() -> None:
    workload = Workload(LENGTHS, concurrency=80, duration_s=40.0, warmup_s=5.0)
    plain = run_seed(replace(TIGHT, kv_blocks=None), workload, ["off"], 0)[0]
    roomy = run_seed(replace(TIGHT, kv_blocks=2000), workload, ["off", "target_output_tps"], 0)
    assert not any(key.startswith("kv_") for key in plain.metrics)
    for run in roomy:
        assert 0 < run.metrics["kv_used_share"] <= 1
        assert run.metrics["kv_memory_bound"] + run.metrics["kv_caps_bound"] <= 1
    assert roomy[0].metrics["kv_paused_blocks_mean"] == 0  # off pauses nobody
    assert roomy[1].metrics["kv_paused_blocks_p99"] > 0


def _cli(tmp_path: Path, *extra: str) -> int:
    trace = write_small_trace(tmp_path / "t.csv")  # longest request: 249 + 69 tokens
    return main(["sim", "--trace", str(trace), "--concurrency", "30", "--workers", "2",
                 "--max-batch", "8", "--duration", "30", "--warmup", "5", "--seeds", "2",
                 "--jobs", "1", "--modes", "off,target_output_tps", *extra])  # fmt: skip


def test_cli_kv_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    assert _cli(tmp_path, "--kv-blocks", "120", "--json", str(out)) == 0
    assert "KV used" in capsys.readouterr().out
    summary = json.loads(out.read_text())["runs"][0]["summary"]
    assert summary["target_output_tps"]["kv_used_share"]["mean"] > 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--kv-blocks", "19"], "longest request (249 prompt + 69 output tokens) needs 20 blocks"),
        (["--kv-blocks", "39", "--kv-block-size", "8"], "needs 40 blocks"),
        (["--kv-block-size", "8"], "give both"),
    ],
)
def test_cli_refuses_a_kv_budget_it_cannot_run(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli(tmp_path, *flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("genpool: error: ") and message in err and "Traceback" not in err


def test_cli_takes_a_budget_that_just_holds_the_longest_request(tmp_path: Path) -> None:
    assert _cli(tmp_path, "--kv-blocks", "20") == 0


@pytest.mark.parametrize("value", ["0", "-3", "x", "1.5"])
def test_cli_kv_values_must_be_positive_integers(value: str, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _cli(tmp_path, "--kv-blocks", value)
    assert exit_info.value.code == 2
