"""The paged KV cache (docs/design.md#kv-blocks): blocks of ``block_size`` tokens.

Per layer, K and V are ``[kv_heads, num_blocks + 1, block_size, head_dim]``: head-major,
so a token's flat row is ``block * block_size + offset`` in ``cache.view(kv_heads, -1,
head_dim)`` and one gather of a batch's rows (``gather``) gives ``[kv_heads, rows, d]``
ready for the CPU path's matmuls (no second copy). Block ``num_blocks`` is the dummy
(padding) block, never a request's. Which blocks a request holds is the scheduler's
decision (``genpool_core.kv_blocks``), carried by the plan; this module only stores.

How many blocks there are comes from memory (``kv_sizing``); the runner's
``cache_engine.CacheEngine`` allocates the cache and hands it to the network's passes,
which ask it where their tokens' rows are (``token_rows``, ``decode_rows``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from . import cpu_attention
from .config import LlamaConfig
from .cpu_attention import InPlaceRows


@dataclass(frozen=True)
class GatheredRows:
    """What torch's matmuls read for a decode batch (without the CPU kernel)."""

    context: torch.Tensor  # ``gather``'s index of each row's positions 0..length-1
    run: int | None  # ``consecutive_run``: the first block when K and V are read in place
    mask: torch.Tensor  # additive [1, B, 1, length]: -inf past each row's own position


@dataclass(frozen=True)
class DecodeRows:
    """Where a torch-path decode batch writes and reads in the cache (flat token rows)."""

    positions: torch.Tensor  # [B]: each row's new token's position
    written: torch.Tensor  # [B]: the flat row it goes to
    reads: InPlaceRows | GatheredRows  # the CPU kernel's tables, or torch's gather


@dataclass(frozen=True)
class PrefillSpan:
    """One request's prompt tokens ``token_ids`` into its table ``blocks`` at positions
    ``start..start + n - 1`` (``start > 0``: a chunk after the KV already there)."""

    blocks: Sequence[int]
    token_ids: Sequence[int]
    start: int = 0


@dataclass(frozen=True)
class SpanRows:
    """Where one span of a batched prefill sits in the pass, and what it attends to."""

    first: int  # its first token's index among the pass's tokens
    num_tokens: int
    context: torch.Tensor | None  # a chunk after others: ``gather`` index of its 0..end-1
    mask: torch.Tensor | None  # [n, end] bool: its row i sees keys 0..start + i (None: causal)


@dataclass(frozen=True)
class PrefillRows:
    """Where a batched prefill's tokens go in the cache, every span's in order."""

    token_ids: torch.Tensor  # [N]
    positions: torch.Tensor  # [N]
    written: torch.Tensor  # [N]: each token's flat row
    last: torch.Tensor  # [spans]: each span's last token's index among the N
    spans: tuple[SpanRows, ...]


class KVCache:
    """Per-layer paged K/V tensors ``[kv_heads, num_blocks + 1, block_size, head_dim]``."""

    def __init__(
        self,
        config: LlamaConfig,
        *,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
        kv_heads: int,
        in_place_decode: bool | None = None,
    ) -> None:
        """``in_place_decode``: decode attention reads the blocks in place with the CPU
        kernel (``cpu_attention``); None = where it runs (float32 in host memory)."""
        usable = cpu_attention.is_usable(device, dtype)
        self.decodes_in_place = usable if in_place_decode is None else in_place_decode
        if self.decodes_in_place and not usable:
            raise ValueError(f"the in-place CPU decode does not run {dtype} on {device}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (kv_heads, num_blocks + 1, block_size, config.head_dim)
        # Where each KV head's rows start in a layer's tensor seen as [heads * rows, d].
        self._head_starts = torch.arange(kv_heads, device=device)[:, None] * (
            (num_blocks + 1) * block_size
        )
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_layers)]

    @property
    def dummy_block(self) -> int:
        return self.num_blocks

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def read_blocks(self, blocks: Sequence[int]) -> Iterator[bytes]:
        """The blocks' K then V of each layer, ``[kv_heads, len(blocks), block_size, d]``
        each, as raw bytes in host memory (the P/D pull's body, docs/pd.md)."""
        index = torch.tensor(list(blocks), device=self.k[0].device)
        for k, v in zip(self.k, self.v, strict=True):
            for tensor in (k, v):
                part = tensor.index_select(1, index).cpu().contiguous()
                yield part.view(torch.uint8).numpy().tobytes()

    def write_blocks(self, blocks: Sequence[int], data: bytearray) -> None:
        """``read_blocks``' bytes (another worker's, of the same layout) into ``blocks``
        (read in place: no copy of the pulled buffer)."""
        k0 = self.k[0]
        shape = (k0.shape[0], len(blocks), k0.shape[2], k0.shape[3])
        per_tensor = k0.element_size() * shape[0] * shape[1] * shape[2] * shape[3]
        if len(data) != 2 * len(self.k) * per_tensor:
            raise ValueError(f"{len(data)} bytes do not fill {len(blocks)} blocks of this cache")
        raw = torch.frombuffer(data, dtype=torch.uint8)
        index = torch.tensor(list(blocks), device=k0.device)
        tensors = [t for pair in zip(self.k, self.v, strict=True) for t in pair]
        for i, tensor in enumerate(tensors):
            part = raw[i * per_tensor : (i + 1) * per_tensor].view(tensor.dtype).view(shape)
            tensor.index_copy_(1, index, part.to(tensor.device))

    def token_rows(self, blocks: Sequence[int], num_tokens: int) -> list[int]:
        """Flat rows of a request's positions ``0..num_tokens-1`` (its blocks in order)."""
        bs = self.block_size
        return [blocks[p // bs] * bs + p % bs for p in range(num_tokens)]

    def gather_index(self, rows: torch.Tensor) -> torch.Tensor:
        """``gather``'s index for the flat token ``rows`` (every KV head's)."""
        return (self._head_starts + rows[None, :]).view(-1)

    @staticmethod
    def gather(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """A layer's K or V at ``gather_index(rows)``: ``[kv_heads, len(rows), d]``.

        One ``index_select`` over the first dimension of ``[heads * rows, d]``: on the CPU
        torch spreads that one over its threads, while selecting along the middle
        dimension of ``[heads, rows, d]`` runs on one (measured 2.7x faster at 2 threads,
        the same at 1; docs/worker.md, decode speed)."""
        heads, d = tensor.shape[0], tensor.shape[-1]
        return tensor.view(-1, d).index_select(0, index).view(heads, -1, d)

    def context_rows(self, block_tables: Sequence[Sequence[int]], length: int) -> torch.Tensor:
        """``[B * length]`` flat rows of positions ``0..length-1`` of each row's table (past
        a row's table: the dummy block, which the caller masks out)."""
        bs = self.block_size
        width = -(-length // bs)
        padded = [list(t[:width]) + [self.dummy_block] * (width - len(t)) for t in block_tables]
        device = self.k[0].device
        table = torch.tensor(padded, device=device)
        rows = (table[:, :, None] * bs + torch.arange(bs, device=device)).reshape(-1, width * bs)
        return rows[:, :length].reshape(-1)

    def consecutive_run(self, block_tables: Sequence[Sequence[int]], length: int) -> int | None:
        """The first block when each row's context is one block and the rows' blocks are
        consecutive (the static layout: blocks of ``max_seq_len`` handed out in order), so
        K and V can be read in place; else None (gathered)."""
        if length > self.block_size:
            return None
        first = block_tables[0][0]
        return first if all(t[0] == first + i for i, t in enumerate(block_tables)) else None

    def prefill_rows(self, spans: Sequence[PrefillSpan]) -> PrefillRows:
        """The rows a batched prefill of ``spans`` writes and attends to."""
        device = self.k[0].device
        tokens: list[int] = []
        positions: list[int] = []
        written: list[int] = []
        rows: list[SpanRows] = []
        for span in spans:
            end = span.start + len(span.token_ids)
            flat = self.token_rows(span.blocks, end)
            context = mask = None
            if span.start:  # reads its earlier chunks' KV back
                context = self.gather_index(torch.tensor(flat, device=device))
                keys_at = torch.arange(end, device=device)
                mask = keys_at[None, :] <= torch.arange(span.start, end, device=device)[:, None]
            rows.append(SpanRows(len(tokens), len(span.token_ids), context, mask))
            tokens.extend(span.token_ids)
            positions.extend(range(span.start, end))
            written.extend(flat[span.start :])
        last = [row.first + row.num_tokens - 1 for row in rows]
        token_ids, at, rows_written, ends = (
            torch.tensor(v, device=device) for v in (tokens, positions, written, last)
        )
        return PrefillRows(token_ids, at, rows_written, ends, tuple(rows))

    def reads_in_place(self, num_rows: int) -> bool:
        """Whether a decode of ``num_rows`` rows reads K/V in place (the CPU kernel)."""
        return self.decodes_in_place and cpu_attention.is_faster(num_rows)

    def decode_rows(
        self, block_tables: Sequence[Sequence[int]], positions: list[int]
    ) -> DecodeRows:
        """The rows a decode at ``positions`` (one per table) writes and attends to."""
        device = self.k[0].device
        pos = torch.tensor(positions, device=device)
        if self.reads_in_place(len(block_tables)):
            bs = self.block_size
            at = [t[p // bs] * bs + p % bs for t, p in zip(block_tables, positions, strict=True)]
            lengths = [p + 1 for p in positions]
            reads = InPlaceRows.of(block_tables, lengths, bs, self.dummy_block)
            return DecodeRows(pos, torch.tensor(at, device=device), reads)
        b, length = len(block_tables), max(positions) + 1
        context = self.context_rows(block_tables, length)
        written = context.view(b, length)[torch.arange(b), pos]
        context = self.gather_index(context)
        # Rows past a request's own position hold stale KV (a previous holder's, or the
        # padding block's): masked out, per row (additive).
        visible = torch.arange(length, device=device) <= pos[:, None]
        mask = torch.zeros(visible.shape, device=device, dtype=self.k[0].dtype)
        mask = mask.masked_fill_(~visible, float("-inf"))[None, :, None, :]
        run = self.consecutive_run(block_tables, length)
        return DecodeRows(pos, written, GatheredRows(context, run, mask))
