"""The CUDA decode path's Triton kernels, run on the CPU by Triton's interpreter.

``TRITON_INTERPRET=1`` must be set before Triton compiles anything, so each check
runs in a fresh interpreter. The paged attention must equal a plain softmax attention
over each row's gathered blocks, whatever the block size, the block order or the
dummy padding; RoPE + KV write must put K and V at the flat token rows the slot
mapping names and nowhere else; and a network whose decode goes through the kernels
(the CUDA path: the cache engine's decode step, forced on here without graphs) must
equal the torch decode path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.model.hf_checkpoints import edit_config, make_checkpoint

pytest.importorskip("triton")

KERNEL_CHECK = """
import torch
from genpool_worker.model.paged_attention import MIN_SPLIT, NUM_SPLITS, paged_decode_attention
torch.manual_seed(0)

def reference(q, kc, vc, table, n, scale):
    k = kc[:, table].flatten(1, 2)[:, :n]  # [kv_heads, n, d]
    v = vc[:, table].flatten(1, 2)[:, :n]
    group = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    return (torch.softmax(q[:, None] @ k.transpose(-1, -2) * scale, -1) @ v)[:, 0]

# (heads, kv heads, head dim, block size, lengths, splits/floor): GQA groups 4, 4, 1;
# the default split geometry and a small floor (more splits per row) at each shape.
long = NUM_SPLITS * MIN_SPLIT + 52  # past the floor: the splits grow, not their number
cases = [(8, 2, 64, 16, [300, 1, 130, 7]), (32, 8, 128, 5, [131, 40]),
         (4, 4, 16, 32, [long, 33, 96])]
for nh, nkv, d, bs, lengths in cases:
    dummy = 40 + long // bs  # every row's blocks fit below it
    kc, vc = torch.randn(2, nkv, dummy + 1, bs, d).unbind(0)  # KVCache's layout
    order = torch.randperm(dummy).tolist()  # scattered, shuffled blocks
    width = -(-max(lengths) // bs) + 2
    tables = torch.full((len(lengths) + 1, width), dummy, dtype=torch.int32)
    for i, n in enumerate(lengths):
        need = -(-n // bs)
        tables[i, :need] = torch.tensor(order[:need], dtype=torch.int32)
        order = order[need:] + order[:need]
    lens = torch.tensor([*lengths, 1])  # last row: batch padding, all dummy block
    q = torch.randn(len(lens), nh, d)
    for splits, floor in ((NUM_SPLITS, MIN_SPLIT), (4, 32)):
        out = paged_decode_attention(q, kc, vc, tables, lens, d ** -0.5,
                                     num_splits=splits, min_split=floor)
        for i, n in enumerate(lens.tolist()):
            ref = reference(q[i], kc, vc, tables[i].long(), n, d ** -0.5)
            torch.testing.assert_close(out[i], ref, rtol=1e-4, atol=1e-4)
print("ok")
"""

ROPE_CACHE_CHECK = """
import torch
from genpool_worker.model.fused_ops import rope_and_cache
from genpool_worker.model.ops import apply_rope
torch.manual_seed(0)
nh, nkv, d, bs, blocks, max_len = 8, 2, 16, 5, 9, 40
angles = torch.randn(max_len, d // 2).repeat(1, 2)
cos, sin = angles.cos(), angles.sin()
signed_sin = torch.cat([-sin[:, : d // 2], sin[:, d // 2 :]], -1)  # as ops.rope_tables
qkv = torch.randn(4, nh + 2 * nkv, d)
positions = torch.tensor([0, 13, 39, 4])
slot_mapping = torch.tensor([44, 7, 23, 0])  # blocks 8, 1, 4, 0: scattered offsets
kc, vc = torch.randn(2, nkv, blocks + 1, bs, d).unbind(0)  # KVCache's layout
k_ref, v_ref = kc.clone(), vc.clone()
q = rope_and_cache(qkv, cos, signed_sin, kc, vc, slot_mapping, positions, nh)
qk = apply_rope(qkv[:, : nh + nkv], cos[positions, None], signed_sin[positions, None])
k_ref.view(nkv, -1, d)[:, slot_mapping] = qk[:, nh:].transpose(0, 1)
v_ref.view(nkv, -1, d)[:, slot_mapping] = qkv[:, nh + nkv :].transpose(0, 1)
torch.testing.assert_close(q, qk[:, :nh])
torch.testing.assert_close(kc, k_ref, rtol=0, atol=0)  # and nothing else written
torch.testing.assert_close(vc, v_ref, rtol=0, atol=0)
print("ok")
"""

FUSED_CHECK = """
import torch
import torch.nn.functional as F
from genpool_worker.model.fused_ops import rms_norm, silu_mul
from genpool_worker.model.ops import rms_norm as torch_rms_norm
torch.manual_seed(0)
x, w = torch.randn(3, 100), torch.randn(100)
torch.testing.assert_close(rms_norm(x, w, 1e-5), torch_rms_norm(x, w, 1e-5))
gate_up = torch.randn(3, 2 * 1500)  # two column blocks, the second partial
gate, up = gate_up.chunk(2, dim=-1)
torch.testing.assert_close(silu_mul(gate_up), F.silu(gate) * up)
print("ok")
"""

MODEL_CHECK = """
import sys, torch
from genpool_worker.model import CacheEngine, KVSizing, LlamaModel, paged_attention
from genpool_worker.model_runner import TorchModelRunner

def build(**engine):  # 14 blocks of 16 (block 14: the dummy)
    model = LlamaModel.from_hf_dir(sys.argv[1], max_seq_len=160)
    return TorchModelRunner(model, CacheEngine(model, KVSizing(16, 14), **engine))

plain = build()
paged_attention.is_usable = lambda device, head_dim: True
fast = build(cuda_graphs=False)
assert fast.model.fused_kernels and fast.kv.decode_graphs is not None
assert plain.kv.decode_graphs is None and not fast.kv.uses_cuda_graphs
# 137 rows + the decoded one in 9 scattered blocks (two attention splits); 3 rows in one.
long_blocks, short_blocks = [11, 2, 7, 0, 13, 5, 9, 1, 4], [6]
long_prompt, short_prompt = [3 + i % 90 for i in range(137)], [1, 5, 9]
for runner in (plain, fast):
    runner.prefill(long_blocks, long_prompt)
    runner.prefill(short_blocks, short_prompt)
args = ([short_blocks, [14], long_blocks], [7, 11, 13], [3, 0, 137])  # a dummy pad row
torch.testing.assert_close(fast.decode(*args)[[0, 2]], plain.decode(*args)[[0, 2]])
# The replayed path refuses what the network's own decode refuses.
try:
    fast.decode([[14, 2]], [7], [20])
except ValueError as exc:
    assert "KV block 14 outside" in str(exc), exc
else:
    raise AssertionError("a table naming the dummy block was decoded")
print("ok")
"""


def _run(script: str, *args: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_paged_kernel_matches_softmax_attention_over_the_gathered_blocks() -> None:
    _run(KERNEL_CHECK)


def test_rope_and_cache_writes_the_mapped_token_rows_only() -> None:
    _run(ROPE_CACHE_CHECK)


def test_fused_norm_and_silu_match_torch() -> None:
    _run(FUSED_CHECK)


def test_model_decode_through_the_kernels_matches_the_torch_path(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, "qwen2")  # head_dim 16: the kernels' smallest
    edit_config(tmp_path, max_position_embeddings=256)
    _run(MODEL_CHECK, str(tmp_path))
