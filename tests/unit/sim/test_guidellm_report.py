"""bench.guidellm_bench's reading of guidellm's JSON report and the scenario it writes.

The report fixture is a real guidellm 0.8.1 report (40 requests against a synthetic
worker) cut down to the fields the bench reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import guidellm_bench
from tests.conftest import TESTS

REPORT = json.loads((TESTS / "data" / "guidellm_report.json").read_text())


def test_the_summary_takes_guidellms_own_numbers() -> None:
    summary = guidellm_bench.summarize(REPORT)
    assert summary["requests"] == {"successful": 40, "errored": 0, "incomplete": 0, "total": 40}
    assert summary["ttft_ms"] == {"mean": 126.867, "p50": 75.309, "p90": 354.287, "p99": 616.989}
    assert summary["itl_ms"]["p90"] == 39.968
    assert summary["tpot_ms"]["p99"] == 58.113
    assert summary["slo_attainment"] == 1.0
    assert summary["goodput_requests_per_s"] == 6.381
    assert summary["requests_per_s"] == 6.381
    assert summary["guidellm_version"] == "0.8.1"


def test_a_report_without_a_benchmark_is_refused() -> None:
    with pytest.raises(ValueError, match="no benchmark"):
        guidellm_bench.summarize({"benchmarks": []})


def test_the_scenario_pairs_the_runs_and_sets_each_requests_floor(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(guidellm_bench, "tokenizer_dir", lambda: tmp_path)
    spec = guidellm_bench.scenario("http://w:1", 7, tmp_path / "r.json")["spec"]
    assert spec["constraints"] == [{"kind": "max_requests", "count": 7}]
    assert spec["seed"] == {"kind": "static", "value": 42}  # the same load for both policies
    assert spec["metrics"]["slo"]["tpot_ms"] == 1000.0 / guidellm_bench.TARGET_OUTPUT_TPS
    assert spec["outputs"] == [{"kind": "json", "path": str(tmp_path / "r.json")}]


def test_the_table_has_a_row_per_policy() -> None:
    summary = guidellm_bench.summarize(REPORT)
    table = guidellm_bench.format_table({"policies": {"pausing": summary, "off": summary}})
    rows = table.splitlines()[2:]
    assert [row.split("|")[1].strip() for row in rows] == ["pausing", "off"]
    assert "75 / 354 / 617" in rows[0] and "100.0%" in rows[0]


def test_the_pool_run_reads_each_pods_own_counters() -> None:
    from bench.guidellm_pool import counters_of

    text = (  # a worker's exposition (prometheus_client's text format), cut down
        "# HELP genpool_completed_total Completed requests\n"
        "# TYPE genpool_completed_total counter\n"
        'genpool_completed_total{model="synthetic:demo"} 41.0\n'
        "# HELP genpool_tokens_total Output tokens produced\n"
        "# TYPE genpool_tokens_total counter\n"
        'genpool_tokens_total{model="synthetic:demo"} 999.0\n'
    )
    assert counters_of(text) == {"genpool_completed": 41.0, "genpool_pauses": 0.0}
