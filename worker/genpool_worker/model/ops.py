"""Small numerical building blocks of the Llama forward, matching HF's conventions."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .gguf_weights import LlamaConfig


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    # Half precision: normalise in float32 as HF's LlamaRMSNorm does, then scale.
    return F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype) * weight


def rope_tables(
    config: LlamaConfig, max_seq_len: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[max_seq_len, head_dim]`` in HF's layout (frequencies repeated twice).

    Computed in float32 (as HF does) and rounded to the model dtype once.
    """
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_base ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
    emb = torch.cat([angles, angles], dim=-1)
    # rotate_half(x) * sin == roll(x, d/2) * [-sin | sin]: one op instead of three.
    sin = emb.sin()
    signed_sin = torch.cat([-sin[:, : d // 2], sin[:, d // 2 :]], dim=-1)
    return emb.cos().to(device, dtype), signed_sin.to(device, dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """HF-style (rotate_half) rotary embedding of ``x [..., heads, head_dim]``."""
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin
