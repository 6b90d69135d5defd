"""The simulator: exact tiny timeline, determinism, conservation, invariants, CLI errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from genpool_core.plan import GenPlan
from genpool_core.scheduler import GenScheduler
from genpool_core.stepmodel import StepModel
from genpool_sim.cli import main
from genpool_sim.cluster import MODES, Cluster, ClusterConfig
from genpool_sim.experiment import Workload, run_seed, simulate
from genpool_sim.records import SimRequest
from genpool_sim.workload import TraceRequest
from tests.unit.support import check_invariants, write_small_trace

FLAT = StepModel(
    t0_s=0.125, per_request_s=0.0, per_context_token_s=0.0,
    prefill_base_s=0.5, prefill_per_token_s=0.0,
)  # fmt: skip
LENGTHS = [TraceRequest(0.0, 300 + 37 * i % 900, 20 + 53 * i % 300) for i in range(200)]


def test_tiny_scenario_gives_the_hand_computed_timeline() -> None:
    cluster = Cluster(ClusterConfig(workers=1, max_batch=1, ctx_servers=1, step_model=FLAT))
    cluster.submit(SimRequest("a", 0.0, prompt_tokens=10, output_tokens=3))
    cluster.submit(SimRequest("b", 0.25, prompt_tokens=10, output_tokens=2))
    cluster.run()
    a, b = cluster.requests["a"], cluster.requests["b"]
    # a: prefill 0-0.5 (token 1), admitted 0.5, decode steps end 0.625 and 0.75.
    assert (a.first_token_time, a.gen_arrival, a.admitted) == (0.5, 0.5, 0.5)
    assert (a.first_gen_token, a.last_token) == (0.625, 0.75)
    assert (a.ttft_ctx, a.ttft, a.admission_wait, a.e2e, a.tpot) == (0.5, 0.625, 0.0, 0.75, 0.125)
    assert a.output_rate == pytest.approx(2 / 0.25)
    # b: waits for the one context server until 0.5, prefill 0.5-1.0; the worker went
    # idle at 0.75 and wakes at 1.0; one decode step.
    assert (b.first_token_time, b.admitted, b.first_gen_token, b.last_token) == (
        1.0,
        1.0,
        1.125,
        1.125,
    )
    assert (b.ttft_ctx, b.ttft, b.e2e, b.tpot) == (0.75, 0.875, 0.875, None)
    assert cluster.tokens_by_time == [(0.625, 1), (0.75, 1), (1.125, 1)]


def test_a_kv_pull_delays_admission_but_not_the_key() -> None:
    # As a decode worker keys a pulled request (docs/pd.md): at its handoff (0.5), and it
    # queues once its 10 tokens' KV are in (0.5 + 10 x 0.01).
    config = ClusterConfig(workers=1, max_batch=1, ctx_servers=1, step_model=FLAT,
                           kv_transfer_s_per_token=0.01)  # fmt: skip
    cluster = Cluster(config)
    cluster.submit(SimRequest("a", 0.0, prompt_tokens=10, output_tokens=3))
    cluster.run()
    a = cluster.requests["a"]
    assert (a.first_token_time, a.gen_arrival) == (0.5, 0.5)
    assert a.admitted == pytest.approx(0.6) and a.admission_wait == pytest.approx(0.1)
    assert a.first_gen_token == pytest.approx(0.725)


def test_single_token_requests_finish_at_the_context_stage() -> None:
    cluster = Cluster(ClusterConfig(workers=1, step_model=FLAT))
    cluster.submit(SimRequest("one", 0.0, 10, 1))
    cluster.run()
    only = cluster.requests["one"]
    assert only.is_done and only.last_token == 0.5 and only.gen_arrival is None


@pytest.mark.parametrize("mode", MODES)
def test_deterministic_per_seed(mode: str) -> None:
    workload = Workload(LENGTHS, concurrency=60, duration_s=40.0, warmup_s=5.0)
    config = ClusterConfig(mode=mode, workers=2, max_batch=8, target_output_tps=12.0)
    first, second = simulate(config, workload, 3), simulate(config, workload, 3)
    key = [(r.request_id, r.first_gen_token, r.last_token) for r in first.requests.values()]
    assert key == [
        (r.request_id, r.first_gen_token, r.last_token) for r in second.requests.values()
    ]
    assert first.stat_lines == second.stat_lines
    other = simulate(config, workload, 4)
    assert [r.last_token for r in other.requests.values()] != [
        r.last_token for r in first.requests.values()
    ]


@pytest.mark.parametrize("mode", MODES)
def test_conservation_and_invariants_in_every_pass(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    passes = []
    original = GenScheduler.step

    def checked_step(self: GenScheduler, now: float) -> GenPlan:
        plan = original(self, now)
        check_invariants(self)
        passes.append(len(plan.paused_ids))
        return plan

    monkeypatch.setattr(GenScheduler, "step", checked_step)
    done_calls: dict[str, int] = {}
    workload = Workload(LENGTHS, concurrency=80, duration_s=60.0, warmup_s=5.0)
    config = ClusterConfig(mode=mode, workers=2, max_batch=8, target_output_tps=12.0)
    cluster = Cluster(config)
    # Reuse simulate's closed loop, counting completions per request.
    import genpool_sim.experiment as experiment

    monkeypatch.setattr(experiment, "Cluster", lambda cfg: cluster)
    simulate(config, workload, 1)
    for request in cluster.requests.values():
        done_calls[request.request_id] = int(request.is_done)
    assert all(done_calls.values()), "every request completes"
    assert len(cluster.requests) > 100
    gen_tokens = sum(n for _, n in cluster.tokens_by_time)
    assert gen_tokens == sum(r.output_tokens - 1 for r in cluster.requests.values())
    for worker in cluster.workers:
        stats = worker.scheduler.make_stats(cluster.now)
        assert stats.residents == 0 and stats.waiters == 0
    if mode in ("tpot_budget", "target_output_tps"):
        assert sum(passes) > 0, "the overload must exercise pausing"
    if mode == "recompute":
        assert sum(r.num_evictions for r in cluster.requests.values()) > 0


def test_auto_target_comes_from_the_off_run() -> None:
    workload = Workload(LENGTHS, concurrency=40, duration_s=40.0, warmup_s=5.0)
    config = ClusterConfig(workers=2, max_batch=8)
    results = run_seed(config, workload, ["target_output_tps", "off"], seed=0)
    assert [r.mode for r in results] == ["off", "target_output_tps"]
    off = results[0]
    assert off.target_output_tps == pytest.approx(off.metrics["output_rate_p50"] / 1.10)
    assert results[1].target_output_tps == off.target_output_tps
    assert 0.0 < off.metrics["below_target"] < 1.0


def test_cli_rejects_bad_traces_with_the_line_and_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = {
        "missing.csv": "arrived_at,num_prefill_tokens\n0.0,5\n",
        "negative.csv": "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,5,3\n1.0,-2,4\n",
        "unsorted.csv": "arrived_at,num_prefill_tokens,num_decode_tokens\n2.0,5,3\n1.0,2,4\n",
        "empty.csv": "",
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        assert main(["sim", "--trace", str(path), "--seeds", "1", "--jobs", "1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("genpool: error: ") and name in err and "Traceback" not in err
        if name in ("negative.csv", "unsorted.csv"):
            assert ":3:" in err
    assert main(["sim", "--trace", str(tmp_path / "nope.csv")]) == 2
    assert "cannot read trace" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["sim", "--modes", "bogus"])
    assert exit_info.value.code == 2


def test_cli_runs_a_small_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_small_trace(tmp_path / "t.csv")
    out = tmp_path / "r.json"
    code = main(["sim", "--trace", str(trace), "--concurrency", "30", "--workers", "2",
                 "--max-batch", "8", "--duration", "40", "--warmup", "5", "--seeds", "2",
                 "--jobs", "1", "--json", str(out)])  # fmt: skip
    assert code == 0
    table = capsys.readouterr().out
    assert "TTFT p90 s" in table and "target_output_tps" in table and "recompute" in table
    import json

    document = json.loads(out.read_text())
    summary = document["runs"][0]["summary"]
    assert set(summary) == set(MODES)
    assert "delta" in summary["target_output_tps"]["ttft_p90"]


@pytest.mark.parametrize(
    "load", [["--rate", "3", "--cv", "1.5"], ["--replay", "--time-scale", "0.5"]]
)
def test_cli_open_loop_workloads(
    load: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [
        json.dumps(
            {"timestamp": 250 * i, "input_length": 100 + i % 40, "output_length": 20 + i % 30}
        )
        for i in range(400)
    ]
    trace.write_text("\n".join(rows) + "\n")
    out = tmp_path / "r.json"
    args = ["sim", "--trace", str(trace), *load, "--workers", "2", "--max-batch", "4",
            "--duration", "60", "--warmup", "5", "--seeds", "1", "--jobs", "1",
            "--modes", "off,tpot_budget", "--json", str(out)]  # fmt: skip
    assert main(args) == 0
    summary = json.loads(out.read_text())["runs"][0]["summary"]
    assert summary["off"]["requests"]["mean"] > 50
    assert summary["tpot_budget"]["output_tokens_per_s"]["mean"] > 0
