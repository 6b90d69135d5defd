"""The KV-cache budget a GenPool's workers get in ``worker.json``, from the spec (pure).

The rule (docs/operator.md, "The KV-cache budget"), first match wins:

1. ``engine.kvCacheMemory`` set: ``kv_cache_memory``, that many bytes per rank.
2. ``engine.gpuMemoryUtilization`` set: ``gpu_memory_utilization``, that share of each GPU.
3. ``accelerator: nvidia``: ``gpu_memory_utilization`` = ``DEFAULT_GPU_MEMORY_UTILIZATION``
   (0.9); the worker measures its weights and activation peak and gives the KV cache the
   rest of that share.
4. ``accelerator: none`` with ``resources.limits.memory`` and a model of the catalogue:
   ``kv_cache_memory`` = what the limit leaves after the float32 weights of every rank
   and ``CPU_RUNTIME_ALLOWANCE`` per rank, split evenly over the ranks (the worker's
   budget is per rank: each rank holds its share of the KV heads of every block). A
   budget that cannot hold one request of ``engine.maxSeqLen`` is refused
   (``KVBudgetError``), so the spec is InvalidSpec rather than pods that are OOM-killed
   or refuse to start, over and over.
5. Otherwise (CPU without a memory limit, or a model the operator cannot size): nothing,
   so the worker's default, room for B + max headroom requests of maxSeqLen.
"""

from __future__ import annotations

from dataclasses import dataclass

from genpool_core.model_catalogue import ModelShape, known_shape
from genpool_core.names import DEFAULT_GPU_MEMORY_UTILIZATION
from genpool_operator.quantity import QuantityError, quantity_value

FLOAT32_BYTES = 4  # a CPU worker holds weights and KV cache in float32
# Resident memory of one CPU rank besides its weights and KV cache, measured on SmolLM2-135M
# (torch 2.x CPU): importing torch and the worker's stack is ~620 MiB (torch alone ~530),
# loading the tokenizer peaks ~170 MiB above that, and loading plus a 2,048-token prefill
# add ~100 MiB more: ~890 MiB at peak. 1 GiB keeps ~130 MiB of margin for allocator slack,
# the HTTP server's buffers and the KV cache's padding block.
CPU_RUNTIME_ALLOWANCE = 1 << 30
MEMORY_FIELD = "spec.resources.limits.memory"


class KVBudgetError(ValueError):
    """A spec whose KV-cache budget cannot be derived; the message names the fields."""


@dataclass(frozen=True, slots=True)
class KVBudgetInputs:
    """What the budget depends on, as the spec states it."""

    model: str
    on_gpu: bool
    tensor_parallel_size: int
    max_seq_len: int
    block_size: int
    kv_cache_memory: int | None  # engine.kvCacheMemory, bytes
    gpu_memory_utilization: float | None
    memory_limit: int | str | None  # resources.limits.memory, as written


def kv_cache_fields(inputs: KVBudgetInputs) -> dict[str, int | float]:
    """``worker.json``'s budget field (``kv_cache_memory`` or ``gpu_memory_utilization``),
    or none for the worker's default; KVBudgetError for a CPU limit too small."""
    if inputs.kv_cache_memory is not None:
        return {"kv_cache_memory": inputs.kv_cache_memory}
    if inputs.gpu_memory_utilization is not None:
        return {"gpu_memory_utilization": inputs.gpu_memory_utilization}
    if inputs.on_gpu:
        return {"gpu_memory_utilization": DEFAULT_GPU_MEMORY_UTILIZATION}
    shape = known_shape(inputs.model)
    if inputs.memory_limit is None or shape is None:
        return {}
    return {"kv_cache_memory": cpu_kv_cache_memory(inputs, shape)}


def cpu_weight_bytes(shape: ModelShape, tensor_parallel_size: int) -> int:
    """float32 weights of every rank together: the sharded layers once, and on each rank
    the embedding and an LM head (its own, or with a tied head the packed copy oneDNN
    makes of the embedding)."""
    matrix = shape.vocab_size * shape.hidden_size
    untied_head = 0 if shape.tied_embeddings else matrix
    sharded = shape.num_params - matrix - untied_head
    return (sharded + tensor_parallel_size * 2 * matrix) * FLOAT32_BYTES


def cpu_kv_cache_memory(inputs: KVBudgetInputs, shape: ModelShape) -> int:
    """Rule 4: each rank's share of what the memory limit leaves; KVBudgetError when it
    cannot hold one request of maxSeqLen."""
    ranks = inputs.tensor_parallel_size
    try:
        limit = quantity_value(inputs.memory_limit)
    except QuantityError as exc:
        raise KVBudgetError(f"{MEMORY_FIELD}: {exc}") from None
    weights = cpu_weight_bytes(shape, ranks)
    per_rank = (limit - weights - ranks * CPU_RUNTIME_ALLOWANCE) // ranks
    # Blocks as the worker counts them: whole blocks of this rank's share of the KV heads.
    block_bytes = shape.kv_bytes_per_token(FLOAT32_BYTES) * inputs.block_size // ranks
    need = -(-inputs.max_seq_len // inputs.block_size)
    if per_rank >= (need + 1) * block_bytes:  # the worker's dummy (padding) block too
        return per_rank
    leaves = f"leaves {_mib(per_rank)} per rank" if per_rank > 0 else "leaves nothing"
    rank_count = "1 rank" if ranks == 1 else f"{ranks} ranks"
    raise KVBudgetError(
        f"{MEMORY_FIELD}: {inputs.memory_limit} {leaves} for the KV cache of {inputs.model} "
        f"on CPU after {_mib(weights)} of float32 weights and a {_mib(CPU_RUNTIME_ALLOWANCE)} "
        f"runtime allowance per rank ({rank_count}); one request of spec.engine.maxSeqLen="
        f"{inputs.max_seq_len} needs {_mib((need + 1) * block_bytes)} per rank ({need} blocks "
        f"of {inputs.block_size} tokens and the padding block): raise resources.limits.memory"
        " or lower engine.maxSeqLen"
    )


def _mib(num_bytes: int) -> str:
    mib = num_bytes / (1 << 20)
    return f"{mib:.0f} MiB" if mib >= 10 else f"{mib:.1f} MiB"
