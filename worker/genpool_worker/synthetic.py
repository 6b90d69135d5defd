"""``--model synthetic:<name>``: no weights; each step sleeps the simulator's step time.

For scale tests of the serving path (HTTP, scheduler, operator) without a model.
Tokens are a deterministic function of the previous token, so outputs are
reproducible; everything it serves is labelled synthetic (logs, /stats, metrics).
Its "KV" is each position's token id (one layer, one head, one int32), stored in real
blocks of the runner's cache (``SyntheticKVCache``), so a P/D transfer between synthetic
workers moves real bytes (docs/pd.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import torch

from genpool_core.model_catalogue import kv_bytes_per_token
from genpool_core.stepmodel import DEFAULT_STEP_MODEL, StepModel
from genpool_worker.kv_layout import KVLayout
from genpool_worker.model.kv_cache import PrefillSpan

SYNTHETIC_VOCAB = 256
SYNTHETIC_EOS = 0
# KV bytes per token a synthetic model's --kv-cache-memory is counted in: Llama-3.1-8B's
# in bfloat16 (32 layers x 8 KV heads x 128 dims x K and V x 2 bytes), what its step
# times model.
SYNTHETIC_KV_BYTES_PER_TOKEN = kv_bytes_per_token(32, 8, 128, 2)


class SyntheticTokenizer:
    """Bytes as tokens (ids 1..255; 0 is EOS): any text round-trips."""

    eos_token_id = SYNTHETIC_EOS
    bos_token_id = None

    def encode(self, text: str) -> list[int]:
        return [b for b in text.encode("utf-8") if b != 0] or [32]

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 < i < 256).decode("utf-8", errors="replace")


class SyntheticKVCache:
    """The synthetic model's KV cache, the runner's: K and V ``[2, num_blocks + 1,
    block_size]`` int32 token ids (block ``num_blocks``: padding), and its P/D port."""

    decode_graphs = None  # nothing to replay: the synthetic decode is a sleep

    def __init__(self, model_name: str, *, num_blocks: int, block_size: int) -> None:
        """``model_name``: the model's, which the wire layout names."""
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.cache = torch.zeros((2, num_blocks + 1, block_size), dtype=torch.int32)
        self._model_name = model_name

    def kv_layout(self) -> KVLayout:
        return KVLayout(self._model_name, "int32", self.block_size, num_layers=1, num_kv_heads=1,
                        head_dim=1)  # fmt: skip

    def read_kv(self, blocks: Sequence[int]) -> Iterator[bytes]:
        index = torch.tensor(list(blocks), dtype=torch.long)
        for part in self.cache:
            yield part.index_select(0, index).contiguous().numpy().tobytes()

    def write_kv(self, blocks: Sequence[int], data: bytearray) -> None:
        values = torch.frombuffer(data, dtype=torch.int32)
        if values.numel() != 2 * len(blocks) * self.block_size:
            raise ValueError(f"{len(data)} bytes do not fill {len(blocks)} synthetic blocks")
        index = torch.tensor(list(blocks), dtype=torch.long)
        self.cache.index_copy_(1, index, values.view(2, len(blocks), self.block_size))


class SyntheticModel:
    """The network: a step's time asleep, then logits of the previous token; its passes
    store each position's token id in the cache they are handed."""

    is_synthetic = True

    def __init__(
        self,
        name: str,
        *,
        max_seq_len: int,
        step_model: StepModel = DEFAULT_STEP_MODEL,
        time_scale: float = 1.0,
    ) -> None:
        self.name = f"synthetic:{name}"
        self.max_seq_len = max_seq_len
        self.vocab_size = SYNTHETIC_VOCAB
        self.eos_token_ids = (SYNTHETIC_EOS,)
        self._step_model = step_model
        self._time_scale = time_scale

    def _logits_for(self, previous: list[int]) -> torch.Tensor:
        # Printable lowercase letters and spaces, never EOS: requests end by length.
        nxt = torch.tensor([97 + (p * 7 + 3) % 26 if p % 5 else 32 for p in previous])
        logits = torch.full((len(previous), SYNTHETIC_VOCAB), -1e4)
        logits[torch.arange(len(previous)), nxt] = 0.0
        return logits

    def prefill_many(
        self, cache: torch.Tensor, spans: Sequence[PrefillSpan], *, all_positions: bool = False
    ) -> torch.Tensor:
        """Each span's positions ``start..`` (a chunked prefill's chunk); logits of each
        span's last token (``all_positions``: of every token). The step model knows one
        prompt's prefill time, so a batch sleeps its prompts' times one after another, as
        the simulator charges them."""
        seconds = sum(self._step_model.prefill_time(len(s.token_ids)) for s in spans)
        time.sleep(self._time_scale * seconds)
        for span in spans:
            if span.blocks:
                _store(cache, span.blocks, span.start, span.token_ids)
        if all_positions:
            return self._logits_for([t for span in spans for t in span.token_ids])
        return self._logits_for([span.token_ids[-1] for span in spans])

    def decode(
        self,
        cache: torch.Tensor,
        block_tables: Sequence[Sequence[int]],
        token_ids: list[int],
        positions: list[int],
    ) -> torch.Tensor:
        context = sum(position + 1 for position in positions)
        step = self._step_model.decode_step_time(len(block_tables), context)
        time.sleep(self._time_scale * step)
        for table, token, position in zip(block_tables, token_ids, positions, strict=True):
            if table:
                _store(cache, table, position, [token])
        return self._logits_for(token_ids)


def _store(
    cache: torch.Tensor, blocks: Sequence[int], start: int, token_ids: Sequence[int]
) -> None:
    block_size = cache.shape[2]
    for offset, token in enumerate(token_ids):
        position = start + offset
        cache[:, blocks[position // block_size], position % block_size] = token
