"""The model runner: prefill, decode and sampling on torch, for the engine loop.

The loop hands it each pass's plan; it returns one sampled token per batch member.
It keeps what the model step needs per request (prompt, last token, position,
sampling parameters and the seeded generator), so the loop never touches a tensor.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from genpool_core.plan import GenPlan
from genpool_worker.engine_io import Arrival, KVImport, ModelInfo
from genpool_worker.pd.layout import KVLayout


class DecodeModel(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def is_synthetic(self) -> bool: ...

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def max_seq_len(self) -> int: ...

    @property
    def num_blocks(self) -> int: ...

    @property
    def block_size(self) -> int: ...

    def prefill(self, blocks: Sequence[int], token_ids: list[int]) -> torch.Tensor: ...

    def decode(
        self, block_tables: Sequence[Sequence[int]], token_ids: list[int], positions: list[int]
    ) -> torch.Tensor: ...

    def kv_layout(self) -> KVLayout | None: ...

    def read_kv(self, blocks: Sequence[int]) -> Iterator[bytes]: ...

    def write_kv(self, blocks: Sequence[int], data: bytes) -> None: ...


@dataclass
class _RunState:
    prompt_ids: list[int]
    temperature: float
    generator: torch.Generator | None
    blocks: tuple[int, ...] = ()  # the KV block table, from the plan that admitted it
    kv_import: KVImport | None = None  # another worker's prefill, written at admission
    num_output_tokens: int = 0
    last_token: int | None = field(default=None)


def _generator(arrival: Arrival) -> torch.Generator | None:
    if arrival.temperature <= 0.0:
        return None
    # A stable seed (not hash()): every rank must draw the same tokens.
    seed = arrival.seed if arrival.seed is not None else zlib.crc32(arrival.request_id.encode())
    return torch.Generator().manual_seed(seed)


class TorchModelRunner:
    def __init__(self, model: DecodeModel) -> None:
        self.model = model
        vocab_size = getattr(model, "vocab_size", None)
        self.info = ModelInfo(
            name=model.name,
            is_synthetic=model.is_synthetic,
            max_seq_len=model.max_seq_len,
            eos_token_id=model.eos_token_id,
            vocab_size=vocab_size if isinstance(vocab_size, int) else None,
            num_kv_blocks=model.num_blocks,
            kv_block_size=model.block_size,
        )
        self._states: dict[str, _RunState] = {}

    def add_request(self, arrival: Arrival) -> None:
        self._states[arrival.request_id] = _RunState(
            list(arrival.prompt_ids), arrival.temperature, _generator(arrival),
            kv_import=arrival.kv_import,
        )  # fmt: skip

    def remove_request(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def execute(self, plan: GenPlan) -> dict[str, int]:
        """Prefill ``plan.prefill_ids`` (their token this pass), decode the rest; each
        request's KV goes to the block table its admission's plan gave it."""
        for request_id, blocks in zip(plan.admitted_ids, plan.admitted_blocks, strict=True):
            self._admit(self._states[request_id], blocks)
        logits: dict[str, torch.Tensor] = {}
        prefill = set(plan.prefill_ids)
        tables: list[tuple[int, ...]] = []
        last, positions, ids = [], [], []
        for request_id in plan.batch_ids:
            state = self._states[request_id]
            if request_id in prefill:
                logits[request_id] = self.model.prefill(state.blocks, state.prompt_ids)
                continue
            assert state.last_token is not None, f"{request_id} decodes before its prefill"
            ids.append(request_id)
            tables.append(state.blocks)
            last.append(state.last_token)
            positions.append(len(state.prompt_ids) + state.num_output_tokens - 1)
        if ids:
            batch_logits = self.model.decode(tables, last, positions)
            logits.update(zip(ids, batch_logits, strict=True))
        tokens = {rid: self._sample(self._states[rid], row) for rid, row in logits.items()}
        for request_id, token in tokens.items():
            state = self._states[request_id]
            state.last_token = token
            state.num_output_tokens += 1
        return tokens

    def _admit(self, state: _RunState, blocks: tuple[int, ...]) -> None:
        """Its blocks; an imported request's pulled KV goes into the first of them and it
        decodes from its first token (it has no prefill here: docs/pd.md)."""
        state.blocks = blocks
        imported, state.kv_import = state.kv_import, None
        if imported is not None and not state.num_output_tokens:
            self.model.write_kv(blocks[: imported.num_blocks], imported.data)
            state.last_token, state.num_output_tokens = imported.first_token, 1

    def kv_layout(self) -> KVLayout | None:
        return self.model.kv_layout()

    def read_kv(self, blocks: Sequence[int]) -> Iterator[bytes]:
        return self.model.read_kv(blocks)

    @staticmethod
    def _sample(state: _RunState, logits: torch.Tensor) -> int:
        if state.temperature <= 0.0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits.float() / state.temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=state.generator))
