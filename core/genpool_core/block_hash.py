"""Block hashes for prefix caching: a full block of tokens is known by a hash of its
tokens, the hash of the block before it, and extra keys (the model), so equal hashes
mean equal KV (docs/design.md#prefix-caching).

A chain: ``hash_i = H(hash_{i-1}, tokens of block i, extra)``, from a fixed root, so a
block's hash pins every token before it too. Deterministic across processes and ranks
(no Python ``hash``). Only full blocks are hashed; a prompt's last partial block is
never shared.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

BlockHash = int  # 64 bits, as KV events carry them
# The top bit is always set: KV event consumers (llm-d's indexer) refuse a hash below
# 2**32, which msgpack would pack short, and refuse the whole batch with it.
_TOP_BIT = 1 << 63
NO_HASH = 0  # never a block's hash (the top bit is set): "holds nothing findable"

_ROOT = 0  # the parent of a sequence's first block


def _encode(parent: BlockHash, tokens: Sequence[int], extra: bytes) -> bytes:
    return struct.pack(f"<QI{len(tokens)}I", parent, len(tokens), *tokens) + extra


def hash_block(parent: BlockHash | None, tokens: Sequence[int], extra: bytes = b"") -> BlockHash:
    """One link: the block after ``parent`` (None: the first) holding ``tokens``."""
    digest = hashlib.sha256(_encode(_ROOT if parent is None else parent, tokens, extra))
    return int.from_bytes(digest.digest()[:8], "little") | _TOP_BIT


def extend_hashes(
    hashes: list[BlockHash], token_ids: Sequence[int], block_size: int, extra: bytes = b""
) -> None:
    """Append the hashes of every full block of ``token_ids`` that ``hashes`` lacks
    (``hashes`` covers its first ``len(hashes)`` blocks already)."""
    parent = hashes[-1] if hashes else None
    for first in range(len(hashes) * block_size, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[first : first + block_size], extra)
        hashes.append(parent)


def block_hashes(token_ids: Sequence[int], block_size: int, extra: bytes = b"") -> list[BlockHash]:
    """The hashes of every full block of ``token_ids``."""
    hashes: list[BlockHash] = []
    extend_hashes(hashes, token_ids, block_size, extra)
    return hashes
