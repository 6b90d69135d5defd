"""guidellm, unmodified from PyPI, against one synthetic GenPool worker: pausing vs off.

The benchmark client most vLLM users reach for runs as they run it (``guidellm run`` with
a scenario file): its openai_http backend streams ``/v1/chat/completions`` with
``stream_options: {include_usage, continuous_usage_stats}``, a constant request rate,
synthetic prompts. The two runs are paired: the same seeded arrivals and prompts against a fresh
worker each, once with pausing (``target_output_tps`` mode, T = ``TARGET_OUTPUT_TPS``) and
once without (``off``). Reported: guidellm's own TTFT, ITL and TPOT percentiles, its SLO
attainment and goodput for TTFT <= ``SLO_TTFT_MS`` and TPOT <= 1000 / T ms (each request's
own floor), from the JSON report it writes.

guidellm needs torch and transformers, which the project's venv has; it is installed once
into a venv of its own outside the repo (``GUIDELLM_VENV``) that sees the project's
site-packages through a ``.pth`` file, so the second copy of torch is not downloaded. Its
synthetic prompts are cut with SmolLM2's tokenizer (saved from the packaged GGUF); the
synthetic worker counts bytes as tokens, so its prompts are ~4-5x longer in its own count
(guidellm prefers the server's usage numbers).
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.fuzz import start_worker

GUIDELLM_VERSION = "0.8.1"
GUIDELLM_VENV = Path(
    os.environ.get("GENPOOL_GUIDELLM_VENV", f"~/.cache/genpool/guidellm-{GUIDELLM_VERSION}")
).expanduser()
TOKENIZER_DIR = GUIDELLM_VENV / "smollm2-tokenizer"
WORKER_ARGS = ("--model", "synthetic:demo", "--max-batch-size", "16")
TARGET_OUTPUT_TPS = 5.0  # a quarter of the synthetic model's ~20 tok/s a request at B = 16
POLICIES = {
    "pausing": ("--preemption-mode", "target_output_tps",
                "--target-output-tps", str(TARGET_OUTPUT_TPS)),
    "off": ("--preemption-mode", "off"),
}  # fmt: skip
SLO_TTFT_MS = 2000.0
# requests/s, just past the worker's capacity here (~2.5/s at B = 16), so a queue builds. A
# constant rate: guidellm 0.8.1's poisson profile sent ~2.4x its rate here (each of its 10
# processes draws the same seeded delays onto one shared clock), while constant keeps it.
RATE = 2.6
FULL_REQUESTS = 160
QUICK_REQUESTS = 30
DATA = {"kind": "synthetic_text", "prompt_tokens": 128, "output_tokens": 128,
        "output_tokens_stdev": 64, "output_tokens_min": 16, "output_tokens_max": 256}  # fmt: skip
PERCENTILES = ("p50", "p90", "p99")
METRICS = {"ttft_ms": "time_to_first_token_ms", "itl_ms": "inter_token_latency_ms",
           "tpot_ms": "time_per_output_token_ms"}  # fmt: skip


def guidellm_binary() -> Path:
    """guidellm GUIDELLM_VERSION in GUIDELLM_VENV, installed on first use."""
    binary = GUIDELLM_VENV / "bin" / "guidellm"
    if binary.exists():
        return binary
    subprocess.run([sys.executable, "-m", "venv", str(GUIDELLM_VENV)], check=True)
    venv_python = GUIDELLM_VENV / "bin" / "python"
    ask = "import site; print(site.getsitepackages()[0])"
    found = subprocess.run([str(venv_python), "-c", ask], capture_output=True, text=True,
                           check=True)  # fmt: skip
    # The project's packages (torch, transformers) after the venv's own: pip sees them
    # installed and adds only what guidellm needs besides.
    Path(found.stdout.strip(), "genpool-project.pth").write_text(site.getsitepackages()[0] + "\n")
    subprocess.run([str(venv_python), "-m", "pip", "install", "-q",
                    f"guidellm=={GUIDELLM_VERSION}"], check=True)  # fmt: skip
    return binary


def tokenizer_dir() -> Path:
    """SmolLM2's tokenizer as a transformers directory (guidellm loads it by path)."""
    if (TOKENIZER_DIR / "tokenizer.json").exists():
        return TOKENIZER_DIR
    from transformers import AutoTokenizer

    from genpool_worker.model.gguf_weights import find_smollm2_gguf

    gguf = find_smollm2_gguf()
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(TOKENIZER_DIR)
    return TOKENIZER_DIR


def scenario(url: str, num_requests: int, report: Path, rate: float = RATE) -> dict[str, Any]:
    """A guidellm scenario (``guidellm run -c``): ``num_requests`` seeded prompts at
    ``rate`` requests/s."""
    return {"spec": {
        "backend": {"kind": "openai_http", "target": url},
        "profile": {"kind": "constant", "rate": [rate]},
        "constraints": [{"kind": "max_requests", "count": num_requests}],
        "tokenizer": {"kind": "huggingface_auto", "model": str(tokenizer_dir())},
        "data": [DATA],
        "seed": {"kind": "static", "value": 42},
        "outputs": [{"kind": "json", "path": str(report)}],
        "metrics": {"kind": "generative",
                    "slo": {"ttft_ms": SLO_TTFT_MS, "tpot_ms": 1000.0 / TARGET_OUTPUT_TPS}},
    }}  # fmt: skip


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """What the comparison reads from guidellm's JSON report (its first benchmark)."""
    benchmarks = report.get("benchmarks")
    if not isinstance(benchmarks, list) or not benchmarks:
        raise ValueError("guidellm's report has no benchmark")
    metrics = benchmarks[0]["metrics"]
    summary: dict[str, Any] = {"requests": dict(metrics["request_totals"])}
    for name, key in METRICS.items():
        stats = metrics[key]["successful"]
        summary[name] = {"mean": stats["mean"]} | {p: stats["percentiles"][p] for p in PERCENTILES}
    summary["output_tokens_per_s"] = metrics["output_tokens_per_second"]["successful"]["mean"]
    summary["requests_per_s"] = metrics["requests_per_second"]["total"]["mean"]  # as sent
    summary["slo_attainment"] = metrics["slo_attainment"]
    goodput = metrics.get("request_goodput") or {}
    summary["goodput_requests_per_s"] = (goodput.get("successful") or {}).get("mean")
    summary["guidellm_version"] = report.get("metadata", {}).get("guidellm_version")
    return summary


def run_policy(flags: tuple[str, ...], num_requests: int) -> dict[str, Any]:
    """One fresh worker with ``flags`` under the load; guidellm's summary of it."""
    binary = guidellm_binary()
    url, worker = start_worker(*flags, base=WORKER_ARGS)
    try:
        with tempfile.TemporaryDirectory(prefix="genpool-guidellm-") as work:
            report, config = Path(work, "report.json"), Path(work, "scenario.json")
            config.write_text(json.dumps(scenario(url, num_requests, report)))
            subprocess.run([str(binary), "run", "-c", str(config), "--disable-console"],
                           cwd=work, check=True, capture_output=True, timeout=1800)  # fmt: skip
            return summarize(json.loads(report.read_text()))
    finally:
        worker.terminate()
        worker.wait(30)


def run(*, quick: bool) -> dict[str, Any]:
    num_requests = QUICK_REQUESTS if quick else FULL_REQUESTS
    policies = {name: run_policy(flags, num_requests) for name, flags in POLICIES.items()}
    return {
        "benchmark": "guidellm",
        "description": "guidellm (PyPI, unmodified) against one synthetic worker, pausing vs off",
        "quick": quick,
        "load": {"rate_per_s": RATE, "requests": num_requests, "data": DATA, "seed": 42},
        "worker": " ".join(WORKER_ARGS),
        "slo": {"ttft_ms": SLO_TTFT_MS, "tpot_ms": 1000.0 / TARGET_OUTPUT_TPS},
        "policies": policies,
    }


def format_table(result: dict[str, Any]) -> str:
    lines = ["| policy | TTFT p50 / p90 / p99 ms | ITL p50 / p90 ms | TPOT p90 ms | SLO attained |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name, s in result["policies"].items():
        ttft, itl, tpot = s["ttft_ms"], s["itl_ms"], s["tpot_ms"]
        attained = s["slo_attainment"]
        lines.append(
            f"| {name} | {ttft['p50']:.0f} / {ttft['p90']:.0f} / {ttft['p99']:.0f} | "
            f"{itl['p50']:.0f} / {itl['p90']:.0f} | {tpot['p90']:.0f} | "
            f"{'-' if attained is None else f'{attained:.1%}'} |"
        )
    return "\n".join(lines)
