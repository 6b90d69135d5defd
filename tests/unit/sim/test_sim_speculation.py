"""Speculative decoding in the simulator: members emit 1 + accepted drafts a step (the
i.i.d. acceptance model, drawn per request and position), verification costs drafted
rows, every request still emits exactly its output, and the SLO mode's rates count
emitted tokens, so a pool that accepts drafts runs requests faster."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from genpool_core.stepmodel import StepModel
from genpool_sim.cli import main
from genpool_sim.cluster import ClusterConfig
from genpool_sim.experiment import Workload, measure, simulate
from genpool_sim.speculation import accepted, expected_tokens_per_step
from genpool_sim.workload import TraceRequest
from tests.unit.support import write_small_trace

LENGTHS = [TraceRequest(0.0, 200 + 31 * i % 500, 30 + 47 * i % 200) for i in range(100)]
# Decode steps dominated by the fixed cost (memory-bound), drafted rows nearly free.
STEP = StepModel(t0_s=0.02, per_request_s=0.0005, per_context_token_s=1e-7,
                 prefill_base_s=0.05, prefill_per_token_s=1e-5)  # fmt: skip
BASE = ClusterConfig(workers=2, max_batch=8, mode="target_output_tps", target_output_tps=20.0,
                     step_model=STEP, ctx_servers=4)  # fmt: skip
WORKLOAD = Workload(LENGTHS, concurrency=24, duration_s=60.0, warmup_s=5.0)


@pytest.mark.parametrize("rate", [0.0, 0.3, 0.8])
def test_accepted_drafts_follow_the_iid_model(rate: float) -> None:
    limit, draws = 4, 20_000
    mean = sum(accepted(f"r:{i}", limit, rate) for i in range(draws)) / draws
    assert mean + 1 == pytest.approx(expected_tokens_per_step(limit, rate), abs=0.03)
    assert accepted("same key", limit, rate) == accepted("same key", limit, rate)


def test_drafts_accepted_run_requests_faster_and_emit_exactly_their_output() -> None:
    runs = {}
    for label, k, rate in (("off", 0, 0.0), ("rejected", 4, 0.0), ("accepted", 4, 0.7)):
        config = replace(BASE, num_speculative_tokens=k, acceptance_rate=rate)
        cluster = simulate(config, WORKLOAD, 0)
        for request in cluster.requests.values():
            if request.is_done:
                assert request.gen is not None
                assert request.gen.num_output_tokens == request.output_tokens
        runs[label], _ = measure(cluster, WORKLOAD, config.target_output_tps)
    # Verifying drafts that are all rejected only costs; accepted ones pay for themselves.
    assert runs["rejected"]["tpot_mean"] > runs["off"]["tpot_mean"]
    assert runs["accepted"]["tpot_mean"] < 0.75 * runs["off"]["tpot_mean"]
    assert runs["accepted"]["below_target"] <= runs["off"]["below_target"]
    assert runs["accepted"]["output_tokens_per_s"] > 1.3 * runs["off"]["output_tokens_per_s"]


def test_the_cli_takes_both_flags_or_neither(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_small_trace(tmp_path / "t.csv")
    run = ["sim", "--trace", str(trace), "--concurrency", "16", "--workers", "1", "--max-batch",
           "8", "--duration", "20", "--warmup", "2", "--seeds", "1", "--jobs", "1"]  # fmt: skip
    assert main([*run, "--speculative-tokens", "4"]) == 2
    assert "give both" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*run, "--speculative-tokens", "4", "--acceptance-rate", "1.5"])
    assert "must be in [0, 1]" in capsys.readouterr().err
    assert main([*run, "--speculative-tokens", "4", "--acceptance-rate", "0.6"]) == 0
    with pytest.raises(ValueError, match="acceptance_rate"):
        ClusterConfig(acceptance_rate=-0.1)
