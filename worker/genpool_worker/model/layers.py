"""The Llama network's weights on their device: embedding, LM head, output norm and each
block's (fused, sharded for tensor parallelism, on the CPU pre-packed for oneDNN)."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .config import LlamaConfig
from .linear import Linear, onednn_available


@dataclass(frozen=True)
class Shard:
    """This process's tensor-parallel position: rank ``rank`` of ``size``."""

    rank: int
    size: int

    def check(self, config: LlamaConfig) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"need 0 <= tp_rank < tp_size, got {self.rank} and {self.size}")
        sizes = {"num_heads": config.num_heads, "num_kv_heads": config.num_kv_heads}
        for what, n in (sizes | {"ffn_size": config.ffn_size}).items():
            if n % self.size:
                raise ValueError(f"tp_size={self.size} must divide the model's {what}={n}")
        if self.size > 1 and not (
            dist.is_available()
            and dist.is_initialized()
            and (dist.get_world_size(), dist.get_rank()) == (self.size, self.rank)
        ):
            raise ValueError(
                f"tp_size={self.size} needs torch.distributed initialised with world_size "
                f"{self.size} and this process at rank tp_rank={self.rank}"
            )


def rank_device(device: torch.device, tp_rank: int) -> torch.device:
    """``cuda`` alone means this rank's own GPU (NCCL needs one device per rank)."""
    if device.type != "cuda":
        return device
    if device.index is None:
        device = torch.device("cuda", tp_rank % max(torch.cuda.device_count(), 1))
    torch.cuda.set_device(device)
    return device


class LayerWeights:
    """One block's weights (this rank's shard), fused for the decode GEMMs.

    Tensor parallelism (docs/design.md#multi-rank) shards by heads and MLP columns: rank r keeps
    its slice of the Q/K/V and gate/up rows and the matching columns of the output
    and down projections, whose partial sums the model all-reduces.
    """

    def __init__(
        self,
        w: MutableMapping[str, torch.Tensor],
        i: int,
        to: dict[str, Any],
        pack: bool,
        tp: Shard,
    ) -> None:
        p = f"blk.{i}."

        def take(name: str, dim: int | None = None) -> torch.Tensor:
            t = w.pop(p + name + ".weight")
            if dim is not None:  # slice before moving: only the shard goes to the device
                t = t.chunk(tp.size, dim=dim)[tp.rank]
            return t.to(**to).contiguous()

        def bias(name: str, dim: int) -> torch.Tensor | None:
            t = w.pop(p + name + ".bias", None)
            if t is None:
                return None
            if dim == 0:  # column-parallel: each rank its slice of the outputs
                return t.chunk(tp.size)[tp.rank].to(**to).contiguous()
            # Row-parallel: the partial sums are all-reduced, so one rank adds the bias.
            return t.to(**to).contiguous() if tp.rank == 0 else None

        self.attn_norm = take("attn_norm")
        self.ffn_norm = take("ffn_norm")
        # One GEMM for Q|K|V and one for gate|up instead of three and two: fewer
        # kernel launches and better GEMM shapes at decode batch sizes.
        qkv = [take("attn_q", 0), take("attn_k", 0), take("attn_v", 0)]
        self.qkv = Linear(
            torch.cat(qkv), bias=_fused_bias(qkv, bias, "attn_q attn_k attn_v"), pack=pack
        )
        self.o = Linear(take("attn_output", 1), bias=bias("attn_output", 1), pack=pack)
        gate_up = [take("ffn_gate", 0), take("ffn_up", 0)]
        self.gate_up = Linear(
            torch.cat(gate_up), bias=_fused_bias(gate_up, bias, "ffn_gate ffn_up"), pack=pack
        )
        self.down = Linear(take("ffn_down", 1), bias=bias("ffn_down", 1), pack=pack)


def _fused_bias(
    weights: list[torch.Tensor], bias: Callable[[str, int], torch.Tensor | None], names: str
) -> torch.Tensor | None:
    """The bias of a fused projection: zeros for the parts that have none (Qwen2 has
    Q/K/V biases, Llama with ``attention_bias`` too; most checkpoints none at all)."""
    parts = [bias(name, 0) for name in names.split()]
    if all(b is None for b in parts):
        return None
    return torch.cat(
        [
            torch.zeros(w.shape[0], dtype=w.dtype, device=w.device) if b is None else b
            for w, b in zip(weights, parts, strict=True)
        ]
    )


class NetworkWeights:
    """Every weight of the network, moved (and popped) from ``w`` in the model dtype."""

    def __init__(
        self,
        w: MutableMapping[str, torch.Tensor],
        config: LlamaConfig,
        to: dict[str, Any],
        use_onednn: bool | None,
        tp: Shard,
    ) -> None:
        """``use_onednn``: pre-packed oneDNN GEMMs (CPU float32); None = when available."""
        available = onednn_available(to["device"], to["dtype"])
        if use_onednn and not available:
            raise ValueError("use_onednn=True needs a float32 CPU model and torch with oneDNN")
        pack = available if use_onednn is None else use_onednn
        self.embed = w.pop("token_embd.weight").to(**to)
        # GGUF omits output.weight when the LM head is tied to the embedding (SmolLM2);
        # a packed head is then a second copy (+113 MB), which buys ~40% of its GEMM.
        head = w.pop("output.weight", None)
        self.lm_head = Linear(self.embed if head is None else head.to(**to), pack=pack)
        self.out_norm = w.pop("output_norm.weight").to(**to)
        self.layers = [LayerWeights(w, i, to, pack, tp) for i in range(config.num_layers)]
