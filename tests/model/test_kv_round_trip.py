"""The KV of a prompt moves between block tables as P/D moves it between workers
(docs/pd.md#the-pull): prefill into one table, ``read_kv`` its blocks, ``write_kv`` the
bytes into other blocks (of a cache whose layout is the same), and the greedy decode from
there equals the decode from the original blocks, token for token. A pull that put the
KV in the wrong blocks or the wrong order would decode other text: the synthetic model's
output ignores its KV, so only this tier can tell."""

from __future__ import annotations

from typing import Any

import torch

from tests.model.paged import BlockPool

PROMPT = "The history of the Roman Empire begins with"
STEPS = 12


def _greedy_from(runner: Any, blocks: list[int], first: int, num_prompt: int) -> list[int]:
    """``STEPS`` greedy tokens decoded after ``first`` from the prompt's KV in ``blocks``."""
    out = [first]
    for step in range(STEPS):
        logits = runner.decode([blocks], [out[-1]], [num_prompt + step])
        out.append(int(logits[0].argmax()))
    return out


def test_kv_read_from_one_table_and_written_into_another_decodes_the_same(
    runner: Any, tokenizer: Any
) -> None:
    ids = tokenizer.encode(PROMPT)
    pool = BlockPool.of(runner)
    room = -(-(len(ids) + STEPS) // runner.kv.block_size)
    source, target = pool.take(room), pool.take(room)
    num_prompt_blocks = -(-len(ids) // runner.kv.block_size)
    with torch.inference_mode():
        first = int(runner.prefill(source, ids).argmax())
        data = bytearray(b"".join(runner.kv.read_kv(source[:num_prompt_blocks])))
        layout = runner.kv.kv_layout()
        assert len(data) == layout.num_bytes(num_prompt_blocks)  # whole blocks, K then V
        runner.kv.write_kv(target[:num_prompt_blocks], data)
        moved = _greedy_from(runner, target, first, len(ids))
        original = _greedy_from(runner, source, first, len(ids))
    assert moved == original
    # And the text is the prompt's: not what a cache of zeros (nothing moved) decodes.
    empty = pool.take(room)
    with torch.inference_mode():
        runner.kv.write_kv(
            empty[:num_prompt_blocks], bytearray(layout.num_bytes(num_prompt_blocks))
        )
        blank = _greedy_from(runner, empty, first, len(ids))
    assert blank != original
