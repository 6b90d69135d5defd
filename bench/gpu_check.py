"""GPU check of the model path: correctness and decode speed against transformers, one GPU.

Random weights at Llama-3.1-8B shape (nothing downloaded): transformers builds the
model in bfloat16 on the GPU, and ours is built from the same tensors (its config
read back through our ``config.json`` reader). Measured, each in its own try/except
(an error is recorded in the JSON and the next measurement runs):

- correctness: transformers' greedy 64 tokens; ours teacher-forced along them
  (top-1 agreement per step: a random model has near-ties, so one flipped argmax
  must not derail the rest) and free-running (tokens equal to transformers').
- decode tokens/s at batch 1, 16, 64, 128 (prompt 128, 64 steps): ours (Triton
  paged attention, CUDA graphs) and transformers ``generate`` with the static cache,
  eager (``disable_compile``) and, time permitting, compiled (its default on CUDA).
  transformers' decode time = time(1 + 64 new tokens) - time(1 new token).
- paged vs the pre-paging kernel (``bench/gpu_check_paged.py``): ours at batch 1, 64,
  128 with the static-slot kernel swapped in (``static_b*``, timing only), and the two
  kernels alone per batch x context 200 / 2048 / 8192 (``attention_sweep``, with the
  paged kernel's other split settings and its error against the static one).
- residents at Azure lengths (``gpu_check_residents``, arithmetic): how many requests one
  H200's KV memory holds paged (block-rounded prompt + output) vs static (a whole
  ``max_seq_len`` slot each).
- batch 1 against the HBM bound: bytes a decode step must read (every weight but
  the embedding table, of which one row is read, plus the KV rows attended) divided
  by the bandwidth (``--bandwidth-tbs``, default 4.8 TB/s: the H200's HBM3e by
  its datasheet).

A time budget (``--budget-s``) skips what would not fit. ``--quick`` runs a tiny
shape (on the CPU when there is no GPU) to prove the script end to end. ``--serving``
then runs the serving check (``bench/gpu_serving.py``: a real worker over HTTP, its
own JSON).

    python3 bench/gpu_check.py --out bench/results/gpu_check.json [--serving]
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ would be sys.path[0] and bench/operator.py would shadow the
# standard library's operator module: put the checkout's packages there instead.
ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
for _package in ("worker", "core", "devcluster"):  # run from a checkout without installing
    if str(ROOT / _package) not in sys.path:
        sys.path.insert(0, str(ROOT / _package))
if str(ROOT) not in sys.path:  # for bench.*; last, after the standard library
    sys.path.append(str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from functools import partial  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from bench.decode_support import Ours  # noqa: E402
from bench.gpu_check_host import measure_host_work  # noqa: E402
from bench.gpu_check_models import (  # noqa: E402
    LLAMA31_8B,
    SEED,
    TINY,
    block_tables,
    build_models,
    correctness,
    hf_generate_static,
)
from bench.gpu_check_paged import attention_sweep, swapped_to_static  # noqa: E402
from bench.gpu_check_report import format_summary, summarize  # noqa: E402
from bench.gpu_check_residents import azure_residents  # noqa: E402
from bench.provenance import provenance  # noqa: E402


class Budget:
    def __init__(self, seconds: float) -> None:
        self.start = time.perf_counter()
        self.seconds = seconds

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    result: dict[str, Any], key: str, budget: Budget, need_s: float, fn: Callable[[], Any]
) -> Any:
    """Run ``fn`` into ``result[key]``; its error (or a budget skip) is recorded instead."""
    if budget.left() < need_s:
        result[key] = {"skipped": f"time budget: {budget.left():.0f} s left, needs ~{need_s:.0f}"}
        print(f"[skip] {key}: budget", flush=True)
        return None
    start = time.perf_counter()
    try:
        value = fn()
    except Exception as exc:  # every failure is data: record it, go on
        result[key] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
        print(f"[error] {key}: {type(exc).__name__}: {exc}", flush=True)
        return None
    result[key] = value
    print(f"[ok] {key} ({time.perf_counter() - start:.1f} s)", flush=True)
    return value


def ours_decode(ours: Ours, batch: int, prompt_len: int, steps: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(SEED + batch)
    prompts = torch.randint(10, ours.model.vocab_size, (batch, prompt_len), generator=g).tolist()
    tables = block_tables(ours, batch, prompt_len + steps)
    run = ours.runner
    tokens = [int(run.prefill(t, p).argmax()) for t, p in zip(tables, prompts, strict=True)]
    positions = [prompt_len] * batch
    run.decode(tables, tokens, positions)  # warm-up (graph capture if not yet)
    _sync(ours.model.device)
    start = time.perf_counter()
    for i in range(steps):
        tokens = run.decode(tables, tokens, [p + i for p in positions]).argmax(-1).tolist()
    _sync(ours.model.device)
    seconds = time.perf_counter() - start
    return {"decode_s": seconds, "tok_s": batch * steps / seconds, "step_ms": 1e3 * seconds / steps}


def hf_decode(hf: Any, batch: int, prompt_len: int, steps: int, compiled: bool) -> dict[str, Any]:
    g = torch.Generator().manual_seed(SEED + batch)
    prompts = torch.randint(10, hf.config.vocab_size, (batch, prompt_len), generator=g)
    prompts = prompts.to(hf.device)
    hf_generate_static(hf, prompts, 2, compiled)  # warm-up (compiles when compiled)
    times = {}
    for new in (steps + 1, 1):
        _sync(hf.device)
        start = time.perf_counter()
        hf_generate_static(hf, prompts, new, compiled)
        _sync(hf.device)
        times[new] = time.perf_counter() - start
    decode_s = times[steps + 1] - times[1]
    if decode_s <= 0:  # only in --quick, where noise exceeds the decode time
        raise RuntimeError(f"decode time not measurable: {times}")
    return {
        "decode_s": decode_s,
        "tok_s": batch * steps / decode_s,
        "step_ms": 1e3 * decode_s / steps,
        "generate_s": times[steps + 1],
        "prefill_and_first_s": times[1],
    }


def measure_hf(
    result: dict[str, Any],
    budget: Budget,
    hf: Any,
    batches: list[int],
    prompt_len: int,
    steps: int,
    compiled: bool,
) -> None:
    """transformers' decode at each batch size, eager (~30 s each) or compiled (~120 s)."""
    kind, need_s = ("hf_compiled", 120) if compiled else ("hf_eager", 30)
    for b in batches:
        decode = partial(hf_decode, hf, b, prompt_len, steps, compiled=compiled)
        measure(result, f"{kind}_b{b}", budget, need_s, decode)


def run(args: argparse.Namespace) -> dict[str, Any]:
    budget = Budget(args.budget_s)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = TINY if args.quick else LLAMA31_8B
    batches = [1, 4] if args.quick else [1, 16, 64, 128]
    steps, prompt_len = (8, 16) if args.quick else (64, 128)
    result: dict[str, Any] = {
        "quick": args.quick,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "shape": {k: v for k, v in shape.items() if k != "rope_scaling"} | {"rope": "llama3"},
        "batches": batches,
        "decode_steps": steps,
        "prompt_len": prompt_len,
        "bandwidth_tb_s": args.bandwidth_tbs,
        "environment": environment(device),
    }
    built = measure(
        result,
        "build",
        budget,
        10,
        lambda: build_models(shape, device, dtype, max(batches), max(prompt_len, 32) + 64 + 8),
    )
    if built is None:
        return result
    hf, ours = built
    result["build"] = {"ours_uses_cuda_graphs": ours.kv.uses_cuda_graphs}
    measure(result, "capture_graphs", budget, 20, lambda: _timed(ours.kv.capture_decode_graphs))
    measure(
        result,
        "correctness",
        budget,
        30,
        lambda: correctness(hf, ours, 64 if not args.quick else 8, 32),
    )
    for b in batches:
        measure(result, f"ours_b{b}", budget, 15, partial(ours_decode, ours, b, prompt_len, steps))
    measure_paged(result, budget, ours, shape, batches, prompt_len, steps)
    measure_hf(result, budget, hf, batches, prompt_len, steps, compiled=False)
    summarize(result, ours.model, prompt_len + steps // 2)
    measure_host_work(measure, budget, result, ours, args.quick)
    if device.type == "cuda" and not args.skip_compiled:
        # compiled: ~1 min of compilation per batch size
        measure_hf(result, budget, hf, [1, 64], prompt_len, steps, compiled=True)
        summarize(result, ours.model, prompt_len + steps // 2)
    return result


def measure_paged(
    result: dict[str, Any],
    budget: Budget,
    ours: Ours,
    shape: dict[str, Any],
    batches: list[int],
    prompt_len: int,
    steps: int,
) -> None:
    """The paged kernel against the pre-paging one (CUDA only), and residents at Azure
    lengths (arithmetic, everywhere)."""
    measure(result, "residents_azure", budget, 1, azure_residents)
    if not ours.kv.uses_cuda_graphs:
        result["static_baseline"] = {"skipped": "needs the CUDA path (Triton, graphs)"}
        return
    compared = batches if result["quick"] else [1, 64, 128]  # ~15 s each
    result["static_batches"] = compared

    def static_decode(b: int) -> dict[str, Any]:
        with swapped_to_static(ours, max(batches)):
            return ours_decode(ours, b, prompt_len, steps)

    for b in compared:
        measure(result, f"static_b{b}", budget, 15, partial(static_decode, b))
    contexts = [48, 300] if result["quick"] else [prompt_len + steps + 8, 2048, 8192]
    sweep = partial(attention_sweep, shape, ours.model.device, compared, contexts, budget.left)
    measure(result, "attention_sweep", budget, 30, sweep)


def _timed(fn: Callable[[], None]) -> dict[str, float]:
    start = time.perf_counter()
    fn()
    return {"seconds": time.perf_counter() - start}


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        env["transformers"] = None
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["gpu_memory_gib"] = torch.cuda.get_device_properties(device).total_memory / 2**30
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "bench/results/gpu_check.json"))
    parser.add_argument("--quick", action="store_true", help="tiny shape, proves the script")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--budget-s", type=float, default=300.0, help="skip what would not fit")
    parser.add_argument("--bandwidth-tbs", type=float, default=4.8, help="HBM bandwidth, TB/s")
    parser.add_argument("--skip-compiled", action="store_true", help="no compiled transformers")
    parser.add_argument("--serving", action="store_true", help="then bench/gpu_serving.py")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    source = provenance("bench.gpu_check", argv)  # the tree at start (bench/freshness.py)
    result = source | run(args)
    result["total_s"] = time.perf_counter() - start
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(format_summary(result))
    print(f"wrote {out}")
    if args.serving:  # its own JSON; the models above are garbage once run() returned
        from bench.gpu_serving import main as serving

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        quick = ["--smoke"] if args.quick else []
        return serving(quick + (["--device", args.device] if args.device else []))
    return 0


if __name__ == "__main__":
    sys.exit(main())
