"""gpu_check's report: the decode table, batch 1 against the HBM bound, paged against the
pre-paging kernel, residents at Azure lengths, the summary."""

from __future__ import annotations

import math
from typing import Any

import torch

from genpool_worker.model import LlamaModel


def step_bytes(ours: LlamaModel, context: int) -> dict[str, float]:
    """Bytes one batch-1 decode step must read: weights (not the embedding table) + KV."""
    c = ours.config
    d, h, f = c.head_dim, c.hidden_size, c.ffn_size
    per_layer = h * (c.num_heads + 2 * c.num_kv_heads) * d + c.num_heads * d * h + 3 * h * f + 2 * h
    params = c.num_layers * per_layer + c.vocab_size * h + h  # + LM head + final norm
    item = torch.empty((), dtype=ours.dtype).element_size()
    kv = 2 * c.num_layers * c.num_kv_heads * d * context * item
    return {"weight_bytes": float(params * item), "kv_bytes": float(kv)}


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
    result["paged_vs_static"] = paged_table(result)
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


def paged_table(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Our decode tok/s with the paged kernel and with the pre-paging one, per batch."""
    rows = []
    for b in result.get("static_batches", []):
        paged, static = result.get(f"ours_b{b}"), result.get(f"static_b{b}")
        row: dict[str, Any] = {"batch": b}
        if isinstance(paged, dict) and "tok_s" in paged:
            row["paged_tok_s"] = paged["tok_s"]
        if isinstance(static, dict) and "tok_s" in static:
            row["static_tok_s"] = static["tok_s"]
        if "paged_tok_s" in row and "static_tok_s" in row:
            row["ratio"] = row["paged_tok_s"] / row["static_tok_s"]
        rows.append(row)
    return rows


def args_bandwidth(result: dict[str, Any]) -> float:
    return float(result["bandwidth_tb_s"]) * 1e12


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
    lines.extend(paged_lines(result))
    lines.extend(host_work_lines(result))
    errors = [
        k for k, v in result.items() if isinstance(v, dict) and ("error" in v or "skipped" in v)
    ]
    lines.append(f"errors/skips: {errors or 'none'}; total {result.get('total_s', 0):.0f} s")
    return "\n".join(lines)


def paged_lines(result: dict[str, Any]) -> list[str]:
    """Paged vs static decode, the kernels alone, and residents at Azure lengths."""
    lines = []
    for row in result.get("paged_vs_static", []):
        lines.append(
            f"batch {row['batch']:>3}: paged {_f(row.get('paged_tok_s'))} tok/s, pre-paging "
            f"kernel {_f(row.get('static_tok_s'))} tok/s, ratio {_f(row.get('ratio'), 3)}"
        )
    sweep = result.get("attention_sweep", {})
    for point in sweep.get("points", []) if isinstance(sweep, dict) else []:
        others = ", ".join(
            f"{k.removesuffix('_us')} {v:.1f}"
            for k, v in point.items()
            if k.startswith("paged_") and k.endswith("_us")
        )
        lines.append(
            f"attention b{point['batch']} ctx {point['context']}: static "
            f"{point['static_us']:.1f} us, paged {point['paged_us']:.1f} us ({others}); "
            f"max |diff| {point['max_abs_diff_vs_static']:.3g}"
        )
    residents = result.get("residents_azure", {})
    for row in residents.get("rows", []) if isinstance(residents, dict) else []:
        lines.append(
            f"residents in {residents['kv_gb']:.0f} GB, block {row['block_size']}, max_seq_len "
            f"{row['max_seq_len']} (serves {row['served_share']:.1%}): static "
            f"{row['static_residents']}, paged {row['paged_residents_mean']} (mean) / "
            f"{row['paged_residents_in_order']} (trace order), x{_f(row['ratio_mean'], 2)}"
        )
    return lines


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def host_work_lines(result: dict[str, Any]) -> list[str]:
    """Issue 36 item 2 on the device (bench/gpu_check_host.py): batched prefill, penalties."""
    lines = []
    for key, row in result.items():
        if key.startswith("batched_prefill_") and isinstance(row, dict) and "ratio" in row:
            lines.append(
                f"prefill {row['prompts']} x {row['prompt_tokens']} tokens: one forward "
                f"{row['one_forward_ms']} ms, one by one {row['one_by_one_ms']} ms "
                f"({row['ratio']}x), same next token {row['same_next_token']}"
            )
        elif key.startswith("penalties_") and isinstance(row, dict) and "kept" in row:
            lines.append(
                f"penalties, {key.removeprefix('penalties_out')} output tokens: counts kept "
                f"{row['kept'] * 1e6:.0f} us a pass, rebuilt {row['rebuilt'] * 1e6:.0f} us"
            )
    return lines
