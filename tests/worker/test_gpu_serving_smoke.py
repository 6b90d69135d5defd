"""The GPU serving check's smoke mode (``python -m bench.gpu_serving --smoke``): the whole
check at a tiny shape on the CPU, so what the GPU run does is proved here. A random HF
checkpoint written, the model-only decode, a real ``genpool-worker`` process driven over
HTTP by streaming ``openai`` clients in two client processes, seeded sampling with
temperature and top_p; and the JSON the GPU run writes has the shape the docs read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CONCURRENCY, TOKENS, PER_PROCESS = (1, 4), 16, 2


def _no_error(phase: Any) -> None:
    assert isinstance(phase, dict) and "error" not in phase, phase


def test_smoke_run_measures_the_serving_path(tmp_path: Path) -> None:
    out = tmp_path / "gpu_serving.json"
    cmd = [sys.executable, "-m", "bench.gpu_serving", "--smoke", "--out", str(out)]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["settings"]["smoke"] is True
    assert result["settings"]["concurrency"] == list(CONCURRENCY)
    for phase in ("checkpoint", "model_only", "serving"):
        _no_error(result[phase])
    serving = result["serving"]
    for c in CONCURRENCY:
        _no_error(serving[f"warmup_c{c}"])
        wave = serving[f"c{c}"]
        _no_error(wave)
        assert result["model_only"][f"b{c}"]["tok_s"] > 0
        assert wave["streams"] == wave["complete"] == c and wave["errors"] == 0
        assert wave["output_tokens"] == c * TOKENS
        assert wave["client_processes"] == -(-c // PER_PROCESS)
        assert wave["wall_tok_s"] > 0 and wave["engine_passes"] > 0
        assert 0 < wave["ttft_p50_ms"] <= wave["ttft_p90_ms"]
        assert wave["steady_tok_s"] is None or wave["steady_tok_s"] > 0
    rows = result["table"]
    assert [row["concurrency"] for row in rows] == list(CONCURRENCY)
    assert all(row["model_only_tok_s"] and row["wall_ratio"] for row in rows)
    assert result["goal"]["met"] is None  # no concurrency 64 in the smoke run
    _no_error(serving["sampling"])
    for variant in ("temperature", "temperature_top_p"):
        check = serving["sampling"][variant]
        assert check["ok"], check["errors"]
        assert check["identical_with_same_seed"] is True
        assert check["differs_with_other_seed"] is True
    assert serving["sampling"]["temperature_top_p"]["params"]["top_p"] == 0.9
