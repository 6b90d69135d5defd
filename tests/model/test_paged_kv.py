"""Batched decode over block tables, with requests paused in place, equals decoding alone.

The property pausing relies on (docs/design.md#capacity): a request left out of decode
calls keeps its KV blocks bit-for-bit, other requests' blocks (including reused ones and
the dummy padding block) are independent, and a resumed request continues exactly as if
never paused. Tables are scattered (tests/model/paged.py): shuffled blocks of 16, taken
as each request grows, so requests decoded together interleave theirs.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.model.paged import BlockPool, Request, block_kv, dummy_row, greedy, same_kv

STEPS = 14  # greedy tokens per request, the prefill's token included

PROMPTS = {
    "a": "The history of the Roman Empire begins with",
    "b": "List the planets of the solar system:",
    "c": "A good breakfast consists of",
    "d": "In Python, a dictionary is",
    "e": "The three laws of thermodynamics state that",
    "f": "Once upon a time, in a small village,",
}


def _admit(runner: Any, pool: BlockPool, ids: list[int]) -> Request:
    r = Request(ids, pool.table(len(ids)))
    r.out.append(int(runner.prefill(r.blocks, ids).argmax()))
    return r


def _step(runner: Any, pool: BlockPool, reqs: list[Request], pad: int = 0) -> None:
    """One batched decode; ``pad`` dummy rows are appended, as batch padding would be.
    A request whose next position is past its blocks takes one more from the pool."""
    live = [r for r in reqs if len(r.out) < STEPS]
    for r in live:
        if r.position // pool.block_size >= len(r.blocks):
            r.blocks += pool.take(1)
    tables = [r.blocks for r in live] + [dummy_row(runner)] * pad
    tokens = [r.out[-1] for r in live] + [0] * pad
    positions = [r.position for r in live] + [0] * pad
    logits = runner.decode(tables, tokens, positions)
    for r, row in zip(live, logits, strict=False):
        r.out.append(int(row.argmax()))


def test_batched_decode_with_pauses_equals_solo(runner: Any, tokenizer: Any) -> None:
    ids = {name: tokenizer.encode(text) for name, text in PROMPTS.items()}
    pool = BlockPool.of(runner, seed=11)
    # The solo runs share one table, then give it back: a, the first admission below,
    # gets its blocks with their stale rows.
    solo_blocks = pool.table(max(len(p) for p in ids.values()) + STEPS)
    solo = {name: greedy(runner, solo_blocks, prompt, STEPS) for name, prompt in ids.items()}
    assert all(len(out) == STEPS for out in solo.values())  # no EOS: every step compared
    pool.give_back(solo_blocks)

    reqs = {n: _admit(runner, pool, ids[n]) for n in "abcd"}
    assert reqs["a"].blocks == solo_blocks[: len(reqs["a"].blocks)]
    for _ in range(3):
        _step(runner, pool, list(reqs.values()))

    # Pause b and d in place. a and c go on with e; when e finishes, f gets e's blocks
    # (same blocks, same offsets: e's longer context stays in them, masked). Dummy
    # padding rows ride along in most steps.
    paused = {n: (list(reqs[n].blocks), block_kv(runner, reqs[n].blocks)) for n in "bd"}
    reqs["e"] = _admit(runner, pool, ids["e"])
    for i in range(STEPS - 1):
        _step(runner, pool, [reqs["a"], reqs["c"], reqs["e"]], pad=i % 3)
    assert len(reqs["e"].out) == STEPS
    e_blocks = reqs["e"].blocks
    pool.give_back(e_blocks)
    reqs["f"] = _admit(runner, pool, ids["f"])
    assert reqs["f"].blocks == e_blocks[: len(reqs["f"].blocks)]
    for _ in range(4):
        _step(runner, pool, [reqs["a"], reqs["c"], reqs["f"]], pad=1)
    for n, (blocks, before) in paused.items():
        assert reqs[n].blocks == blocks, n  # a paused request takes no block
        assert same_kv(before, block_kv(runner, blocks)), n

    # Resume b and d (a and c are done by now): everyone runs to STEPS tokens.
    while not all(len(r.out) >= STEPS for r in reqs.values()):
        _step(runner, pool, list(reqs.values()))
    tables = [r.blocks for r in reqs.values()]
    assert any(t != list(range(t[0], t[0] + len(t))) for t in tables)  # paged for real
    for name, r in reqs.items():
        assert r.out == solo[name], name


def _token_rows(runner: Any) -> list[torch.Tensor]:
    """Every layer's K and V as ``[num_blocks + 1, block_size, kv_heads * head_dim]``."""
    cache = runner.kv.cache
    return [t.permute(1, 2, 0, 3).flatten(2).clone() for t in (*cache.k, *cache.v)]


def test_decode_writes_only_each_rows_position(runner: Any) -> None:
    """A decode writes each row's token at ``table[p // block_size]``, offset ``p %
    block_size``, and no other position of any real block (padding rows included)."""
    # Noise first: a padding row's write (token 0 at position 0) is the same every time,
    # so over an earlier one's it would change nothing. Stale KV is masked, any value.
    g = torch.Generator().manual_seed(12)
    for t in (*runner.kv.cache.k, *runner.kv.cache.v):
        t.copy_(torch.randn(t.shape, generator=g))
    pool = BlockPool.of(runner, seed=12)
    prompts = [[10 + i, 20, 30, 40] + [50 + i] * (4 * i) for i in range(6)]
    tables = [pool.table(len(p) + 1) for p in prompts]
    for table, prompt in zip(tables, prompts, strict=True):
        runner.prefill(table, prompt)
    before = _token_rows(runner)
    rows = [3, 5, 2]  # positions 16 (a block not written yet), 24 and 12
    runner.decode(
        [tables[i] for i in rows] + [dummy_row(runner)] * 2,
        [7, 8, 9, 0, 0],
        [len(prompts[i]) for i in rows] + [0, 0],
    )
    changed = torch.zeros(runner.kv.num_blocks + 1, runner.kv.block_size, dtype=torch.bool)
    for old, new in zip(before, _token_rows(runner), strict=True):
        changed |= (old != new).any(-1)
    bs = runner.kv.block_size
    written = {(tables[i][len(prompts[i]) // bs], len(prompts[i]) % bs) for i in rows}
    real = changed[: runner.kv.num_blocks].nonzero().tolist()
    assert {(b, o) for b, o in real} == written
