"""CPU decode at batch 16 through the Hugging Face checkpoint path: ours vs transformers.

A SmolLM2-135M-shaped Llama (30 layers, hidden 576, 9 heads / 3 KV heads, tied
embeddings, vocab 49152) with random weights is written by transformers
(``save_pretrained``, nothing downloaded) and loaded by both: ours with
``LlamaModel.from_hf_dir`` (float32, oneDNN GEMMs) behind a runner, transformers with
``from_pretrained`` in float32. Both decode greedily from the same 16 seeded random
prompts of 128 tokens, 64 steps, with the same torch thread count (1 and all cores).
Runs alternate between the two, best of 3 kept.

- ours: ``prefill`` each request (untimed), then 64 batched ``decode`` steps, timed,
  argmax and ``.tolist()`` included; a paged KV cache of blocks of 16 for 22 requests,
  the 16 tables as the worker's pool hands them out after churn
  (``decode_support.running_pool_tables``). ``bench/worker.py`` compares this layout
  with the static one.
- transformers: ``generate`` greedy, ``min_new_tokens = max_new_tokens``; decode
  time = time(1 + 64 new tokens) - time(1 new token).

    python -m bench.cpu_decode [--quick] [--out bench/results/cpu_decode.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ would be sys.path[0] and bench/operator.py would shadow the
# standard library's operator module.
ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:  # for bench.decode_support; last, after the standard library
    sys.path.append(str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import tempfile  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from bench.decode_support import Ours, running_pool_tables, time_hf, time_ours  # noqa: E402
from bench.provenance import provenance  # noqa: E402
from genpool_core.names import DEFAULT_KV_BLOCK_SIZE  # noqa: E402
from genpool_worker.model import LlamaModel  # noqa: E402

SMOLLM2_SHAPE: dict[str, Any] = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "architectures": ["LlamaForCausalLM"],
}
BATCH = 16
POOL = BATCH + 6  # resident requests the KV cache holds
BLOCK = DEFAULT_KV_BLOCK_SIZE
SEED = 20261130


def _random_checkpoint(directory: Path, shape: dict[str, Any]) -> None:
    import transformers

    config = transformers.LlamaConfig(**shape)
    torch.manual_seed(SEED)
    model: Any = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # larger than the init's std 0.02: logits with a clear argmax
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0.0, 0.05)
    model.save_pretrained(directory)


def _load_models(shape: dict[str, Any], max_seq_len: int) -> tuple[Ours, Any]:
    """A random checkpoint of ``shape`` in a temporary directory, loaded by both."""
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        _random_checkpoint(Path(tmp), shape)
        model = LlamaModel.from_hf_dir(tmp, max_seq_len=max_seq_len)
        ours = Ours.with_blocks(model, POOL * -(-max_seq_len // BLOCK), BLOCK)
        hf: Any = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
        hf.eval()
    return ours, hf


def _measure_row(
    ours: Ours,
    hf: Any,
    prompts: list[list[int]],
    tables: list[list[int]],
    threads: int,
    steps: int,
    repeats: int,
) -> dict[str, Any]:
    """Best of ``repeats`` alternating runs at ``threads`` torch threads: one table row."""
    torch.set_num_threads(threads)
    best = {"ours": float("inf"), "hf_full": float("inf"), "hf_first": float("inf")}
    agree = 0.0
    for _ in range(repeats):
        t, ours_out = time_ours(ours, prompts, tables, steps)
        best["ours"] = min(best["ours"], t)
        t, hf_out = time_hf(hf, prompts, steps + 1)
        best["hf_full"] = min(best["hf_full"], t)
        best["hf_first"] = min(best["hf_first"], time_hf(hf, prompts, 1)[0])
        same = sum(
            a == b for x, y in zip(ours_out, hf_out, strict=True) for a, b in zip(x, y, strict=True)
        )
        agree = same / (BATCH * (steps + 1))
    hf_decode_s = best["hf_full"] - best["hf_first"]
    ours_tok_s = BATCH * steps / best["ours"]
    hf_tok_s = BATCH * steps / hf_decode_s if hf_decode_s > 0 else None
    return {
        "threads": threads,
        "batch": BATCH,
        "ours_tok_s": ours_tok_s,
        "hf_tok_s": hf_tok_s,
        "ratio": ours_tok_s / hf_tok_s if hf_tok_s else None,
        "greedy_token_agreement": agree,
    }


def run(quick: bool) -> dict[str, Any]:
    import transformers

    hf_logging: Any = transformers.utils.logging
    hf_logging.set_verbosity_error()
    prompt_len, steps, repeats = (16, 4, 1) if quick else (128, 64, 3)
    shape = {**SMOLLM2_SHAPE, "num_hidden_layers": 2} if quick else SMOLLM2_SHAPE
    max_seq_len = prompt_len + steps + 2
    ours, hf = _load_models(shape, max_seq_len)
    rng = random.Random(SEED)
    prompts = [
        [rng.randrange(10, shape["vocab_size"]) for _ in range(prompt_len)] for _ in range(BATCH)
    ]
    tables = running_pool_tables(ours.kv.num_blocks, BLOCK, max_seq_len, BATCH, SEED)
    time_ours(ours, prompts[:1], tables[:1], 2)  # warm-up
    time_hf(hf, prompts[:1], 2)
    threads_before = torch.get_num_threads()
    load_before = os.getloadavg()[0]
    rows = [
        _measure_row(ours, hf, prompts, tables, threads, steps, repeats)
        for threads in sorted({1, threads_before})
    ]
    torch.set_num_threads(threads_before)
    return {
        "quick": quick,
        "model": "random SmolLM2-135M-shaped HF checkpoint",
        "dtype": "float32",
        "prompt_len": prompt_len,
        "decode_steps": steps,
        "repeats": repeats,
        "ours_uses_onednn": ours.model.uses_onednn,
        "kv_block_size": BLOCK,
        "rows": rows,
        "environment": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "loadavg_1m": {"before": load_before, "after": os.getloadavg()[0]},
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "bench/results/cpu_decode.json"))
    args = parser.parse_args(argv)
    source = provenance("bench.cpu_decode", argv)  # the tree that runs
    result = {**source, **run(args.quick)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for row in result["rows"]:
        print(
            f"threads {row['threads']} batch {row['batch']}: ours {row['ours_tok_s']:.1f} tok/s, "
            f"transformers {row['hf_tok_s'] or 0:.1f} tok/s, ratio {row['ratio'] or 0:.2f}, "
            f"greedy agreement {row['greedy_token_agreement']:.2f}"
        )
    print(f"load avg {result['environment']['loadavg_1m']}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
