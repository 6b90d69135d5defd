"""``genpool sim --tune``: the tuner in the simulator's loop, and phased workloads."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from genpool_core.controller import knobs_in_force
from genpool_core.knobs import KnobBounds as Bounds
from genpool_sim import cli
from genpool_sim.cluster import ClusterConfig
from genpool_sim.experiment import Workload, run_seed, simulate
from genpool_sim.phases import Phase, clients_at, parse_phases, phase_starts
from genpool_sim.pool_control import SimPool, TuneConfig
from genpool_sim.workload import TraceRequest

LENGTHS = [TraceRequest(0.0, 200, 80), TraceRequest(0.0, 800, 300), TraceRequest(0.0, 50, 20)]
SMALL = ClusterConfig(mode="target_output_tps", workers=2, max_batch=8, ctx_servers=2,
                      target_output_tps=12.0)  # fmt: skip


def test_parse_phases() -> None:
    assert parse_phases("120:150, 240:300,60:0") == [
        Phase(120.0, 150),
        Phase(240.0, 300),
        Phase(60.0, 0),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("120", "expected SECONDS:CLIENTS"),
        ("120:x", "CLIENTS an integer"),
        ("abc:3", "SECONDS is a number"),
        ("0:3", "SECONDS > 0"),
        ("inf:3", "SECONDS > 0"),
        ("10:-1", "CLIENTS >= 0"),
        ("10:0,5:0", "at least one phase needs clients"),
        ("10:3,", "phase 2"),
    ],
)
def test_parse_phases_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_phases(text)


def test_clients_at_phase_boundaries() -> None:
    phases = parse_phases("10:5,20:8,10:2")
    assert phase_starts(phases) == [0.0, 10.0, 30.0]
    assert [clients_at(phases, t) for t in (0, 9.99, 10, 29.9, 30, 39.9, 40, 99)] == [
        5, 5, 8, 8, 2, 2, 0, 0
    ]  # fmt: skip


def test_phases_set_the_duration_and_exclude_other_loads() -> None:
    workload = Workload(LENGTHS, phases=parse_phases("10:5,20:8"), warmup_s=1)
    assert workload.duration_s == 30.0
    with pytest.raises(ValueError):
        Workload(LENGTHS, concurrency=3, phases=parse_phases("10:5"))


def test_phased_clients_follow_the_phases() -> None:
    workload = Workload(LENGTHS, phases=parse_phases("20:4,20:12,20:2"), warmup_s=0)
    cluster = simulate(SMALL, workload, seed=1)
    requests = list(cluster.requests.values())
    for start, end, count in ((0, 20, 4), (20, 40, 12), (40, 60, 2)):
        senders = {r.client for r in requests if start + 1 <= r.arrival < end}
        assert senders and max(c for c in senders if c is not None) < count
    assert max(r.arrival for r in requests) < 60
    assert all(r.is_done for r in requests)


def test_a_single_phase_is_the_plain_closed_loop() -> None:
    plain = simulate(SMALL, Workload(LENGTHS, concurrency=6, duration_s=30, warmup_s=0), 3)
    phased = simulate(SMALL, Workload(LENGTHS, phases=[Phase(30.0, 6)], warmup_s=0), 3)
    assert [(r.request_id, r.arrival, r.last_token) for r in plain.requests.values()] == [
        (r.request_id, r.arrival, r.last_token) for r in phased.requests.values()
    ]


def _tuned_run(bounds: Bounds, seed: int = 0) -> tuple[SimPool, list[tuple[int, int]]]:
    workload = Workload(LENGTHS, phases=parse_phases("40:6,60:30,40:8"), warmup_s=0)
    tuner = SimPool(10.0, TuneConfig(bounds, interval_s=10.0))
    config = replace(SMALL, max_resident_headroom=bounds.max_resident_headroom)
    cluster = simulate(config, workload, seed, tuner)
    knobs = [(w.scheduler.slots.resident_headroom(), w.scheduler.knobs.paused_cap)
             for w in cluster.workers]  # fmt: skip
    return tuner, knobs


def test_the_tuner_runs_every_interval_and_drives_every_worker() -> None:
    tuner, knobs = _tuned_run(Bounds(0, 8, 0, 8))
    assert [r["t"] for r in tuner.records] == [10.0 * k for k in range(1, 15)]
    assert tuner.settings is not None
    final = knobs_in_force(tuner.settings, tuner.state)
    assert knobs == [(final.resident_headroom, final.paused_cap)] * 2
    assert tuner.num_changes >= 1, "the 30-client phase overloads 2 x 8 slots"
    for record in tuner.records:
        assert 0 <= int(str(record["cap"])) <= int(str(record["headroom"])) <= 8
        assert isinstance(record["stats"], dict) and "belowTargetWindow" in record["stats"]


def test_start_knobs_are_clamped_into_the_bounds() -> None:
    tuner, knobs = _tuned_run(Bounds(0, 2, 0, 2))
    assert all(h <= 2 and p <= 2 for h, p in knobs)
    assert all(int(str(r["cap"])) <= 2 for r in tuner.records)


def test_tuned_runs_are_deterministic() -> None:
    assert (
        _tuned_run(Bounds(0, 8, 0, 8), 5)[0].records == _tuned_run(Bounds(0, 8, 0, 8), 5)[0].records
    )


def test_run_seed_tunes_only_the_slo_mode() -> None:
    workload = Workload(LENGTHS, phases=parse_phases("20:6,20:20"), warmup_s=5)
    tune = TuneConfig(Bounds(0, 8, 0, 8), interval_s=10.0)
    base = ClusterConfig(workers=2, max_batch=8, ctx_servers=2)
    results = run_seed(base, workload, ["off", "tpot_budget", "target_output_tps"], 0, tune=tune)
    tuning = {r.mode: r.tuning for r in results}
    assert tuning["off"] == [] and tuning["tpot_budget"] == []
    assert len(tuning["target_output_tps"]) == 4


def test_cli_tune_writes_the_decisions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,200,80\n1,800,300\n")
    out = tmp_path / "out.json"
    code = cli.main(["sim", "--trace", str(trace), "--phases", "20:10,20:40", "--warmup", "5",
                     "--workers", "2", "--max-batch", "8", "--ctx-servers", "2", "--seeds", "1",
                     "--jobs", "1", "--modes", "off,target_output_tps", "--tune",
                     "--tune-interval", "10", "--cap-max", "6", "--json", str(out)])  # fmt: skip
    assert code == 0
    assert "tuner seed 0" in capsys.readouterr().out
    document = json.loads(out.read_text())
    seeds = document["runs"][0]["per_seed"]
    slo = next(s for s in seeds if s["mode"] == "target_output_tps")
    assert len(slo["tuning"]) == 4
    assert all(d["cap"] <= 6 for d in slo["tuning"])
    assert "tuning" not in next(s for s in seeds if s["mode"] == "off")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--phases", "20:10", "--duration", "50"], "--phases sets the duration"),
        (["--phases", "20:10", "--tune", "--cap-max", "9", "--headroom-max", "4"],
         "tuner bounds"),
        (["--phases", "20:10", "--tune", "--cap-min", "5", "--cap-max", "3"], "tuner bounds"),
    ],
)  # fmt: skip
def test_cli_refuses_bad_tune_options(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["sim", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("phases", ["20", "20:x", "0:5", "20:0"])
def test_cli_refuses_bad_phases(phases: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["sim", "--phases", phases])
    assert exit_info.value.code == 2
