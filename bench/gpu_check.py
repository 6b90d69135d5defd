"""GPU check of the model path: correctness and decode speed against transformers, one GPU.

Random weights at Llama-3.1-8B shape (nothing downloaded): transformers builds the
model in bfloat16 on the GPU, and ours is built from the same tensors (its config
read back through our ``config.json`` reader). Measured, each in its own try/except
(an error is recorded in the JSON and the next measurement runs):

- correctness: transformers' greedy 64 tokens; ours teacher-forced along them
  (top-1 agreement per step: a random model has near-ties, so one flipped argmax
  must not derail the rest) and free-running (tokens equal to transformers').
- decode tokens/s at batch 1, 16, 64, 128 (prompt 128, 64 steps): ours (Triton
  slot attention, CUDA graphs) and transformers ``generate`` with the static cache,
  eager (``disable_compile``) and, time permitting, compiled (its default on CUDA).
  transformers' decode time = time(1 + 64 new tokens) - time(1 new token).
- batch 1 against the HBM bound: bytes a decode step must read (every weight but
  the embedding table, of which one row is read, plus the KV rows attended) divided
  by the bandwidth (``--bandwidth-tbs``, default 4.8 TB/s: the H200's HBM3e by
  its datasheet).

A time budget (``--budget-s``) skips what would not fit. ``--quick`` runs a tiny
shape (on the CPU when there is no GPU) to prove the script end to end.

    python3 bench/gpu_check.py --out bench/results/gpu_check.json
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ would be sys.path[0] and bench/operator.py would shadow the
# standard library's operator module: put the checkout's packages there instead.
ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
for _package in ("worker", "core"):  # run from a checkout without installing
    if str(ROOT / _package) not in sys.path:
        sys.path.insert(0, str(ROOT / _package))

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from functools import partial  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from genpool_worker.model import LlamaModel  # noqa: E402
from genpool_worker.model.hf_config import read_hf_config  # noqa: E402
from genpool_worker.model.hf_weights import gguf_name  # noqa: E402

LLAMA31_8B: dict[str, Any] = {
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
TINY: dict[str, Any] = {
    **LLAMA31_8B,
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
SEED = 20261130
NUM_PROMPTS = 4  # correctness: 4 x 64 teacher-forced positions


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


def build_models(
    shape: dict[str, Any], device: torch.device, dtype: torch.dtype, num_slots: int, max_len: int
) -> tuple[Any, LlamaModel]:
    import transformers

    config = transformers.LlamaConfig(**shape, architectures=["LlamaForCausalLM"])
    torch.manual_seed(SEED)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            hf: Any = transformers.LlamaForCausalLM(config)
            hf.eval()
    finally:
        torch.set_default_dtype(before)
    with tempfile.TemporaryDirectory() as tmp:
        hf.config.save_pretrained(tmp)
        (Path(tmp) / "config.json").write_text(
            json.dumps({**json.loads((Path(tmp) / "config.json").read_text()), "dtype": None})
        )
        ours_config, _ = read_hf_config(Path(tmp))
    weights = {}
    for name, tensor in hf.state_dict().items():
        ours_name = gguf_name(name)
        if ours_name is not None:
            weights[ours_name] = tensor
    ours = LlamaModel(
        ours_config,
        weights,
        num_slots=num_slots,
        max_seq_len=max_len,
        device=device,
        dtype=dtype,
        name="llama-3.1-8b-shape-random",
        consume_weights=True,
    )
    return hf, ours


def _hf_generate(hf: Any, prompts: torch.Tensor, new: int, compiled: bool) -> torch.Tensor:
    with torch.inference_mode():
        out: torch.Tensor = hf.generate(
            input_ids=prompts,
            attention_mask=torch.ones_like(prompts),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            cache_implementation="static",
            disable_compile=not compiled,
            pad_token_id=0,
        )
    return out[:, prompts.shape[1] :]


def correctness(hf: Any, ours: LlamaModel, steps: int, prompt_len: int) -> dict[str, Any]:
    """Top-1 agreement along transformers' greedy sequence, ours and transformers' own
    bf16 each against a float32 copy of the same weights (the bf16 rounding noise of a
    random 32-layer model is the yardstick: ours should be as close as transformers)."""
    import copy

    g = torch.Generator().manual_seed(SEED)
    prompts = torch.randint(10, ours.vocab_size, (NUM_PROMPTS, prompt_len), generator=g)
    prompts = prompts.to(ours.device)
    hf_tokens = _hf_generate(hf, prompts, steps, compiled=False)
    sequences = torch.cat([prompts, hf_tokens[:, :-1]], dim=1)
    with torch.inference_mode():
        hf_logits = hf(sequences).logits[:, prompt_len - 1 :].float()
        reference = copy.deepcopy(hf).float()
        ref_logits = reference(sequences).logits[:, prompt_len - 1 :].float()
        del reference
    slots = list(range(NUM_PROMPTS))
    ids = prompts.tolist()
    forced_steps = [torch.stack([ours.prefill(s, ids[s]) for s in slots])]
    for i in range(steps - 1):  # teacher-forced, batched: feed transformers' token i
        forced_steps.append(
            ours.decode(slots, hf_tokens[:, i].tolist(), [prompt_len + i] * NUM_PROMPTS)
        )
    forced = torch.stack(forced_steps, dim=1).float()
    free = [int(ours.prefill(0, ids[0]).argmax())]
    for i in range(steps - 1):
        free.append(int(ours.decode([0], [free[-1]], [prompt_len + i])[0].argmax()))
    first = hf_tokens[0].tolist()
    prefix = next((i for i, (a, b) in enumerate(zip(free, first, strict=True)) if a != b), steps)
    ref_top1 = ref_logits.argmax(-1)

    def agree(logits: torch.Tensor, target: torch.Tensor) -> float:
        return float((logits.argmax(-1) == target).float().mean())

    return {
        "steps": steps,
        "prompts": NUM_PROMPTS,
        "prompt_len": prompt_len,
        "teacher_forced_top1_agreement": agree(forced, hf_logits.argmax(-1)),
        "ours_bf16_vs_fp32_top1": agree(forced, ref_top1),
        "hf_bf16_vs_fp32_top1": agree(hf_logits, ref_top1),
        "ours_vs_hf_max_abs_logit_diff": float((forced - hf_logits).abs().max()),
        "ours_vs_fp32_max_abs_logit_diff": float((forced - ref_logits).abs().max()),
        "hf_vs_fp32_max_abs_logit_diff": float((hf_logits - ref_logits).abs().max()),
        "logit_std": float(ref_logits.std()),
        "free_running_agreement": sum(a == b for a, b in zip(free, first, strict=True)) / steps,
        "free_running_identical_prefix": prefix,
    }


def ours_decode(ours: LlamaModel, batch: int, prompt_len: int, steps: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(SEED + batch)
    prompts = torch.randint(10, ours.vocab_size, (batch, prompt_len), generator=g).tolist()
    slots = list(range(batch))
    tokens = [int(ours.prefill(s, p).argmax()) for s, p in zip(slots, prompts, strict=True)]
    positions = [prompt_len] * batch
    ours.decode(slots, tokens, positions)  # warm-up (graph capture if not yet)
    _sync(ours.device)
    start = time.perf_counter()
    for i in range(steps):
        tokens = ours.decode(slots, tokens, [p + i for p in positions]).argmax(-1).tolist()
    _sync(ours.device)
    seconds = time.perf_counter() - start
    return {"decode_s": seconds, "tok_s": batch * steps / seconds, "step_ms": 1e3 * seconds / steps}


def hf_decode(hf: Any, batch: int, prompt_len: int, steps: int, compiled: bool) -> dict[str, Any]:
    g = torch.Generator().manual_seed(SEED + batch)
    prompts = torch.randint(10, hf.config.vocab_size, (batch, prompt_len), generator=g)
    prompts = prompts.to(hf.device)
    _hf_generate(hf, prompts, 2, compiled)  # warm-up (compiles when compiled)
    times = {}
    for new in (steps + 1, 1):
        _sync(hf.device)
        start = time.perf_counter()
        _hf_generate(hf, prompts, new, compiled)
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


def step_bytes(ours: LlamaModel, context: int) -> dict[str, float]:
    """Bytes one batch-1 decode step must read: weights (not the embedding table) + KV."""
    c = ours.config
    d, h, f = c.head_dim, c.hidden_size, c.ffn_size
    per_layer = h * (c.num_heads + 2 * c.num_kv_heads) * d + c.num_heads * d * h + 3 * h * f + 2 * h
    params = c.num_layers * per_layer + c.vocab_size * h + h  # + LM head + final norm
    item = torch.empty((), dtype=ours.dtype).element_size()
    kv = 2 * c.num_layers * c.num_kv_heads * d * context * item
    return {"weight_bytes": float(params * item), "kv_bytes": float(kv)}


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
    result["build"] = {"ours_uses_cuda_graphs": ours.uses_cuda_graphs}
    measure(result, "capture_graphs", budget, 20, lambda: _timed(ours.capture_decode_graphs))
    measure(
        result,
        "correctness",
        budget,
        30,
        lambda: correctness(hf, ours, 64 if not args.quick else 8, 32),
    )
    for b in batches:
        measure(result, f"ours_b{b}", budget, 15, partial(ours_decode, ours, b, prompt_len, steps))
    for b in batches:
        measure(
            result,
            f"hf_eager_b{b}",
            budget,
            30,
            partial(hf_decode, hf, b, prompt_len, steps, compiled=False),
        )
    summarize(result, ours, prompt_len + steps // 2)
    if device.type == "cuda" and not args.skip_compiled:
        for b in (1, 64):  # compiled: ~1 min of compilation per batch size
            measure(
                result,
                f"hf_compiled_b{b}",
                budget,
                120,
                partial(hf_decode, hf, b, prompt_len, steps, compiled=True),
            )
        summarize(result, ours, prompt_len + steps // 2)
    return result


def _timed(fn: Callable[[], None]) -> dict[str, float]:
    start = time.perf_counter()
    fn()
    return {"seconds": time.perf_counter() - start}


def summarize(result: dict[str, Any], ours: LlamaModel, mean_context: int) -> None:
    rows = []
    for b in result["batches"]:
        row: dict[str, Any] = {"batch": b}
        for key, name in (
            ("ours", "ours"),
            ("hf_eager", "hf_eager"),
            ("hf_compiled", "hf_compiled"),
        ):
            value = result.get(f"{key}_b{b}")
            if isinstance(value, dict) and "tok_s" in value:
                row[f"{name}_tok_s"] = value["tok_s"]
        if "ours_tok_s" in row:
            for ref in ("hf_eager", "hf_compiled"):
                if f"{ref}_tok_s" in row:
                    row[f"ratio_vs_{ref}"] = row["ours_tok_s"] / row[f"{ref}_tok_s"]
        rows.append(row)
    result["decode_table"] = rows
    read = step_bytes(ours, mean_context)
    bound = args_bandwidth(result) / (read["weight_bytes"] + read["kv_bytes"])
    b1 = result.get("ours_b1")
    result["bandwidth_bound_b1"] = {
        **read,
        "bandwidth_bytes_s": args_bandwidth(result),
        "bound_tok_s": bound,
        "ours_tok_s": b1["tok_s"] if isinstance(b1, dict) and "tok_s" in b1 else None,
        "fraction": b1["tok_s"] / bound if isinstance(b1, dict) and "tok_s" in b1 else None,
    }


def args_bandwidth(result: dict[str, Any]) -> float:
    return float(result["bandwidth_tb_s"]) * 1e12


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


def format_summary(result: dict[str, Any]) -> str:
    lines = [
        f"gpu_check: {result['device']} {result['dtype']} "
        f"{result['environment'].get('gpu', '')} torch {result['environment']['torch']}"
        + ("  [QUICK: tiny shape, numbers not meaningful]" if result["quick"] else "")
    ]
    corr = result.get("correctness", {})
    if "teacher_forced_top1_agreement" in corr:
        lines.append(
            f"correctness ({corr['prompts']} x {corr['steps']} greedy steps, teacher-forced "
            f"top-1): ours vs "
            f"transformers {corr['teacher_forced_top1_agreement']:.3f}; vs float32: ours "
            f"{corr['ours_bf16_vs_fp32_top1']:.3f}, transformers bf16 "
            f"{corr['hf_bf16_vs_fp32_top1']:.3f}; max |dlogit| vs float32: ours "
            f"{corr['ours_vs_fp32_max_abs_logit_diff']:.3g}, transformers "
            f"{corr['hf_vs_fp32_max_abs_logit_diff']:.3g} (logit std {corr['logit_std']:.3g}); "
            f"free-running {corr['free_running_agreement']:.3f}"
        )
    else:
        lines.append(f"correctness: {corr}")
    lines.append(
        f"{'batch':>5} {'ours tok/s':>11} {'hf eager':>10} {'x':>6} {'hf compiled':>12} {'x':>6}"
    )
    for row in result.get("decode_table", []):
        lines.append(
            f"{row['batch']:>5} {_f(row.get('ours_tok_s')):>11} "
            f"{_f(row.get('hf_eager_tok_s')):>10} "
            f"{_f(row.get('ratio_vs_hf_eager'), 2):>6} {_f(row.get('hf_compiled_tok_s')):>12} "
            f"{_f(row.get('ratio_vs_hf_compiled'), 2):>6}"
        )
    bw = result.get("bandwidth_bound_b1", {})
    if bw:
        lines.append(
            f"batch 1 vs HBM bound ({result['bandwidth_tb_s']} TB/s, "
            f"{bw['weight_bytes'] / 1e9:.2f} GB weights + {bw['kv_bytes'] / 1e6:.1f} MB KV per "
            f"step): bound {bw['bound_tok_s']:.1f} tok/s, ours {_f(bw['ours_tok_s'])}, fraction "
            f"{_f(bw['fraction'], 3)}"
        )
    errors = [
        k for k, v in result.items() if isinstance(v, dict) and ("error" in v or "skipped" in v)
    ]
    lines.append(f"errors/skips: {errors or 'none'}; total {result.get('total_s', 0):.0f} s")
    return "\n".join(lines)


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "bench/results/gpu_check.json"))
    parser.add_argument("--quick", action="store_true", help="tiny shape, proves the script")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip what would not fit")
    parser.add_argument("--bandwidth-tbs", type=float, default=4.8, help="HBM bandwidth, TB/s")
    parser.add_argument("--skip-compiled", action="store_true", help="no compiled transformers")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    result = run(args)
    result["total_s"] = time.perf_counter() - start
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(format_summary(result))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
