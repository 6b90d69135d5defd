"""``--classes``: request classes with their own SLOs in the simulator (docs/sim.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from genpool_core.names import OFF_MODE, SLO_MODE
from genpool_sim.cli import main
from genpool_sim.cluster import ClusterConfig
from genpool_sim.experiment import PER_REQUEST_MODE, Workload, run_seed, simulate
from genpool_sim.records import SimRequest
from genpool_sim.report import class_summary, format_class_table, summarize
from genpool_sim.slo_classes import ClassPicker, SloClass, class_metrics, parse_classes
from genpool_sim.workload import TraceRequest
from tests.unit.support import write_small_trace

LENGTHS = [TraceRequest(0.0, 300 + 37 * i % 900, 20 + 53 * i % 300) for i in range(200)]
TWO = "interactive:0.3:tpot_ms=50,batch:0.7:tpot_ms=400:ttft_ms=2000"


def test_parse_classes_reads_shares_floors_and_targets() -> None:
    interactive, batch = parse_classes(TWO)
    assert interactive == SloClass("interactive", 0.3, tpot_ms=50.0)
    assert (interactive.target_output_tps, interactive.slo_ttft_s) == (20.0, None)
    assert (batch.target_output_tps, batch.slo_ttft_s) == (2.5, 2.0)
    assert parse_classes("all:1") == [SloClass("all", 1.0)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a:0.5,b:0.4", "add up to 1"),
        ("a:0.5,a:0.5", "must differ"),
        ("a", "expected NAME:SHARE"),
        ("A:1", "expected NAME:SHARE"),
        ("a:x", "SHARE 'x' is not a number"),
        ("a:0", "SHARE must be in (0, 1]"),
        ("a:1:tpot=5", "unknown field 'tpot=5'"),
        ("a:1:tpot_ms=0", "tpot_ms must be > 0"),
        ("a:1:ttft_ms=nan", "ttft_ms must be finite"),
        ("a:1:tpot_ms=5:tpot_ms=6", "given twice"),
    ],
)
def test_parse_classes_names_the_bad_item(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_classes(text)
    assert message in str(info.value)


def test_cli_rejects_bad_classes_in_one_line_naming_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["sim", "--classes", "interactive:0.3:tpot_ms=50,batch:0.6"])
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "argument --classes: shares must add up to 1, got 0.9" in last


def test_class_draws_follow_shares_and_leave_the_seeds_workload_alone() -> None:
    classes = parse_classes(TWO)
    picker = ClassPicker(classes, seed=3)
    labels = []
    for number in range(4000):
        request = SimRequest(f"r{number}", 0.0, 10, 10)
        picker.assign(request, carries_slo=number % 2 == 0)
        labels.append(request.slo_class)
        if number % 2:
            assert request.target_output_tps is None and request.slo_ttft_s is None
        else:
            assert request.target_output_tps in (20.0, 2.5)
    assert labels.count("interactive") / len(labels) == pytest.approx(0.3, abs=0.03)
    again = ClassPicker(classes, seed=3)
    replay = [SimRequest(f"r{n}", 0.0, 10, 10) for n in range(50)]
    for request in replay:
        again.assign(request, carries_slo=False)
    assert [r.slo_class for r in replay] == labels[:50]
    # Labels come from their own stream: the arrivals and lengths a seed draws stay put.
    config = ClusterConfig(workers=2, max_batch=8)
    workload = Workload(LENGTHS, concurrency=20, duration_s=30.0, warmup_s=5.0)
    plain = simulate(config, workload, 7)
    classed = simulate(config, Workload(LENGTHS, concurrency=20, duration_s=30.0,
                                        warmup_s=5.0, classes=classes), 7)  # fmt: skip
    shape = [
        (r.arrival, r.prompt_tokens, r.output_tokens, r.last_token) for r in plain.requests.values()
    ]
    assert shape == [
        (r.arrival, r.prompt_tokens, r.output_tokens, r.last_token)
        for r in classed.requests.values()
    ]


def finished(name: str, slo_class: str, rate: float, wait: float) -> SimRequest:
    request = SimRequest(name, 0.0, 10, 11, slo_class=slo_class)
    request.first_token_time = request.gen_arrival = 1.0
    request.admitted, request.first_gen_token = 1.0 + wait, 1.5 + wait
    request.last_token = 1.0 + 10 / rate
    request.is_done = True
    return request


def test_class_metrics_count_each_class_against_its_own_floor() -> None:
    classes = [SloClass("fast", 0.5, tpot_ms=100.0), SloClass("rest", 0.5, ttft_ms=500.0)]
    done = [
        finished("a", "fast", rate=12.0, wait=0.0),  # floor 10: met
        finished("b", "fast", rate=8.0, wait=0.0),  # missed
        finished("c", "rest", rate=8.0, wait=0.2),  # pool T 5: met, wait on target
        finished("d", "rest", rate=4.0, wait=0.9),  # missed, wait over D_i
    ]
    metrics = class_metrics(done, classes, pool_tps=5.0)
    assert metrics["class.fast.below_target"] == 0.5
    assert metrics["class.rest.below_target"] == 0.5
    assert metrics["class.rest.wait_over_target"] == 0.5
    assert "class.fast.wait_over_target" not in metrics
    assert metrics["class.fast.requests"] == 2.0
    assert metrics["class_below_target"] == 0.5


def test_run_seed_adds_the_per_request_run_and_per_class_metrics() -> None:
    classes = parse_classes("tight:0.3:tpot_ms=60,loose:0.7:tpot_ms=400")
    workload = Workload(LENGTHS, concurrency=60, duration_s=60.0, warmup_s=10.0, classes=classes)
    config = ClusterConfig(workers=2, max_batch=8)
    results = run_seed(config, workload, [OFF_MODE, SLO_MODE], seed=1)
    assert [r.mode for r in results] == [OFF_MODE, SLO_MODE, PER_REQUEST_MODE]
    by_mode = {r.mode: r.metrics for r in results}
    for metrics in by_mode.values():
        assert metrics["class.tight.requests"] + metrics["class.loose.requests"] > 0
        assert 0.0 <= metrics["class.tight.below_target"] <= 1.0
    # Carrying the floors changes what the pool does, not only how it is scored.
    assert by_mode[SLO_MODE] != by_mode[PER_REQUEST_MODE]
    summary = summarize(results)
    entry = summary[PER_REQUEST_MODE]["class.tight.below_target"]
    assert entry["vs_pool_t_delta"] == pytest.approx(
        by_mode[PER_REQUEST_MODE]["class.tight.below_target"]
        - by_mode[SLO_MODE]["class.tight.below_target"]
    )
    assert "vs_pool_t_delta" not in summary[SLO_MODE]["class.tight.below_target"]
    table = format_class_table(summary, classes)
    assert "tight (tpot 60 ms) below own floor" in table and PER_REQUEST_MODE in table
    assert "vs pool T" in table
    per_class = class_summary(summary, classes)
    assert per_class["tight"]["tpot_ms"] == 60.0
    modes = per_class["tight"]["modes"]
    assert isinstance(modes, dict) and "below_target" in modes[PER_REQUEST_MODE]


def test_cli_writes_per_class_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_small_trace(tmp_path / "t.csv")
    out = tmp_path / "r.json"
    code = main(["sim", "--trace", str(trace), "--concurrency", "30", "--workers", "2",
                 "--max-batch", "8", "--duration", "40", "--warmup", "5", "--seeds", "2",
                 "--jobs", "1", "--modes", "off,target_output_tps",
                 "--classes", "a:0.5:tpot_ms=40,b:0.5", "--json", str(out)])  # fmt: skip
    assert code == 0
    assert "a (tpot 40 ms) below own floor" in capsys.readouterr().out
    run = json.loads(out.read_text())["runs"][0]
    assert set(run["classes"]) == {"a", "b"}
    entry = run["classes"]["a"]["modes"][PER_REQUEST_MODE]["below_target"]
    assert entry["seeds"] == 2.0 and "ci95" in entry
