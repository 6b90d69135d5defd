"""A short, seeded fuzz of a real worker process (bench/fuzz.py runs thousands of cases):
schemathesis against the worker's own OpenAPI schema and hypothesis strategies for bodies,
headers and handles. Every answer is a 2xx or a 4xx and the engine never dies."""

from __future__ import annotations

from bench.fuzz import fuzz, start_worker

SEED = 7  # another seed than the bench's: the two runs see different cases


def test_a_seeded_fuzz_finds_no_5xx_and_no_engine_death() -> None:
    url, process = start_worker()
    try:
        report = fuzz(url, openapi_cases=8, body_cases=120, seed_value=SEED)
    finally:
        process.terminate()
        process.wait(30)
    total = report["total"]
    assert total["engine_deaths"] == 0 and total["num_5xx"] == 0, total["findings"]
    assert total["transport_errors"] == 0, total["findings"]
    assert total["cases"] >= 200 and total["by_class"].get("2xx", 0) > 0, total
    assert report["openapi"]["cases"] > 0 and report["bodies"]["cases"] == 120
