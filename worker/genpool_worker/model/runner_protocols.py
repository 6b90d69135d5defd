"""What the model runner needs of a network and of the KV cache it runs over: the
network's forward passes (``DecodeModel``: ``LlamaModel``, the synthetic model), and the
cache's owner (``KVCacheOwner``: ``CacheEngine``, ``SyntheticKVCache``) with its decode
replayed from CUDA graphs (``DecodeGraphs``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, TypeVar

import torch

from genpool_worker.kv_layout import KVLayout

from .kv_cache import PrefillSpan

Tables = Sequence[Sequence[int]]
# The KV cache's type, as the cache's owner holds it and its network takes it.
_CacheIn = TypeVar("_CacheIn", contravariant=True)
_CacheOut = TypeVar("_CacheOut", covariant=True)


class DecodeModel(Protocol[_CacheIn]):
    """A network: forward passes over the KV cache the runner hands it."""

    @property
    def name(self) -> str: ...

    @property
    def is_synthetic(self) -> bool: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    @property
    def max_seq_len(self) -> int: ...

    def prefill_many(
        self, cache: _CacheIn, spans: Sequence[PrefillSpan], *, all_positions: bool = False
    ) -> torch.Tensor: ...

    def decode(
        self, cache: _CacheIn, block_tables: Tables, token_ids: list[int], positions: list[int]
    ) -> torch.Tensor: ...


class DecodeGraphs(Protocol):
    """The network's decode step over the cache, replayed from CUDA graphs."""

    def run(
        self, block_tables: Tables, token_ids: list[int], positions: list[int]
    ) -> torch.Tensor: ...


class KVCacheOwner(Protocol[_CacheOut]):
    """What the runner owns of the KV cache: the cache (sized and allocated), the decode
    graphs captured over it (None: the network's own decode), and the P/D port."""

    @property
    def cache(self) -> _CacheOut: ...

    @property
    def num_blocks(self) -> int: ...

    @property
    def block_size(self) -> int: ...

    @property
    def decode_graphs(self) -> DecodeGraphs | None: ...

    def kv_layout(self) -> KVLayout | None: ...

    def read_kv(self, blocks: Sequence[int]) -> Iterator[bytes]: ...

    def write_kv(self, blocks: Sequence[int], data: bytearray) -> None: ...
