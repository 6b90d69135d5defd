"""The CUDA decode path's Triton attention, run on the CPU by Triton's interpreter.

``TRITON_INTERPRET=1`` must be set before Triton compiles anything, so each check
runs in a fresh interpreter. The kernel must equal a plain softmax attention over
each row's own slot and length, and a model whose decode goes through it (the
CUDA path, forced on here without graphs) must equal the torch decode path.
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
from genpool_worker.model.slot_attention import slot_decode_attention
torch.manual_seed(0)
# (rows, heads, kv heads, head dim, slots, max_seq_len): GQA groups 4, 4, 1; several splits
for b, nh, nkv, d, num_slots, max_len in [(3, 8, 2, 64, 4, 300), (1, 32, 8, 128, 2, 130),
                                          (5, 4, 4, 16, 6, 40)]:
    kc = torch.randn(num_slots + 1, nkv, max_len, d)
    vc = torch.randn(num_slots + 1, nkv, max_len, d)
    q = torch.randn(b, nh, d)
    slots = torch.tensor([(i * 2 + 1) % (num_slots + 1) for i in range(b)])
    lengths = torch.tensor([1 + (i * 97) % max_len for i in range(b)])
    out = slot_decode_attention(q, kc, vc, slots, lengths, d ** -0.5)
    for i in range(b):
        n, s = int(lengths[i]), int(slots[i])
        k = kc[s, :, :n].repeat_interleave(nh // nkv, 0)
        v = vc[s, :, :n].repeat_interleave(nh // nkv, 0)
        ref = torch.softmax(q[i][:, None] @ k.transpose(-1, -2) * d ** -0.5, -1) @ v
        torch.testing.assert_close(out[i], ref[:, 0], rtol=1e-4, atol=1e-4)
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
from genpool_worker.model import LlamaModel, slot_attention
plain = LlamaModel.from_hf_dir(sys.argv[1], num_slots=3, max_seq_len=160)
slot_attention.is_usable = lambda device, head_dim: True
fast = LlamaModel.from_hf_dir(sys.argv[1], num_slots=3, max_seq_len=160, cuda_graphs=False)
assert fast._fast is not None and not fast.uses_cuda_graphs
prompts = {0: [3 + i % 90 for i in range(137)], 2: [1, 5, 9]}  # 137 rows: two attention splits
for model in (plain, fast):
    for slot, prompt in prompts.items():
        model.prefill(slot, prompt)
args = ([2, 3, 0], [7, 11, 13], [3, 0, 137])  # scattered slots and a dummy pad row
torch.testing.assert_close(fast.decode(*args)[[0, 2]], plain.decode(*args)[[0, 2]])
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


def test_kernel_matches_softmax_attention_per_slot_and_length() -> None:
    _run(KERNEL_CHECK)


def test_fused_norm_and_silu_match_torch() -> None:
    _run(FUSED_CHECK)


def test_model_decode_through_the_kernel_matches_the_torch_path(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, "qwen2")  # head_dim 16: the kernel's smallest
    edit_config(tmp_path, max_position_embeddings=256)
    _run(MODEL_CHECK, str(tmp_path))
