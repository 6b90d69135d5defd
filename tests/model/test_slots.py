"""Batched decode over slots, with requests paused in place, equals decoding alone.

The property pausing relies on (docs/design.md#capacity): a request left out of decode calls
keeps its KV bit-for-bit, other slots (including reused ones and the dummy padding
slot) are independent, and a resumed request continues exactly as if never paused.
"""

from __future__ import annotations

from typing import Any

import torch

STEPS = 14  # greedy tokens per request, the prefill's token included

PROMPTS = {
    "a": "The history of the Roman Empire begins with",
    "b": "List the planets of the solar system:",
    "c": "A good breakfast consists of",
    "d": "In Python, a dictionary is",
    "e": "The three laws of thermodynamics state that",
    "f": "Once upon a time, in a small village,",
}


class Req:
    def __init__(self, ids: list[int], slot: int, first: int) -> None:
        self.ids, self.slot, self.out = ids, slot, [first]

    @property
    def done(self) -> bool:
        return len(self.out) >= STEPS


def _solo(model: Any, ids: list[int]) -> list[int]:
    out = [int(model.prefill(0, ids).argmax())]
    while len(out) < STEPS:
        out.append(int(model.decode([0], [out[-1]], [len(ids) + len(out) - 1])[0].argmax()))
    return out


def _admit(model: Any, ids: list[int], slot: int) -> Req:
    return Req(ids, slot, int(model.prefill(slot, ids).argmax()))


def _step(model: Any, reqs: list[Req], pad: int = 0) -> None:
    """One batched decode; `pad` dummy-slot rows are appended, as batch padding would be."""
    live = [r for r in reqs if not r.done]
    slots = [r.slot for r in live] + [model.dummy_slot] * pad
    tokens = [r.out[-1] for r in live] + [0] * pad
    positions = [len(r.ids) + len(r.out) - 1 for r in live] + [0] * pad
    logits = model.decode(slots, tokens, positions)
    for r, row in zip(live, logits, strict=False):
        r.out.append(int(row.argmax()))


def _kv(model: Any, slot: int) -> list[torch.Tensor]:
    cache = model.kv_cache
    return [t[slot].clone() for t in (*cache.k, *cache.v)]


def test_batched_decode_with_pauses_equals_solo(model: Any, tokenizer: Any) -> None:
    ids = {name: tokenizer.encode(text) for name, text in PROMPTS.items()}
    solo = {name: _solo(model, prompt) for name, prompt in ids.items()}

    # Four requests in scattered slots; slot 0 (used by the solo runs) is reused below.
    reqs = {n: _admit(model, ids[n], s) for n, s in (("a", 3), ("b", 1), ("c", 6), ("d", 4))}
    for _ in range(3):
        _step(model, list(reqs.values()))

    # Pause b and d in place. a and c go on with e, admitted into slot 0 (which holds
    # the solo runs' stale rows); when e finishes, f reuses slot 0. Dummy-slot padding
    # rows ride along in most steps.
    paused = {n: _kv(model, reqs[n].slot) for n in ("b", "d")}
    reqs["e"] = _admit(model, ids["e"], 0)
    for i in range(STEPS - 1):
        _step(model, [reqs["a"], reqs["c"], reqs["e"]], pad=i % 3)
    assert reqs["e"].done
    reqs["f"] = _admit(model, ids["f"], 0)  # e's longer context stays in rows: masked
    for _ in range(4):
        _step(model, [reqs["a"], reqs["c"], reqs["f"]], pad=1)
    for n, before in paused.items():
        after = _kv(model, reqs[n].slot)
        assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True)), n

    # Resume b and d (a and c are done by now): everyone runs to STEPS tokens.
    while not all(r.done for r in reqs.values()):
        _step(model, list(reqs.values()))
    for name, r in reqs.items():
        assert r.out == solo[name], name


def test_decode_touches_only_listed_slots(model: Any) -> None:
    for slot in range(model.num_slots):
        model.prefill(slot, [10 + slot, 20, 30, 40])
    before = [_kv(model, s) for s in range(model.num_slots)]
    model.decode([2, 5], [7, 8], [4, 4])
    for slot in range(model.num_slots):
        after = _kv(model, slot)
        same = all(torch.equal(x, y) for x, y in zip(before[slot], after, strict=True))
        assert same == (slot not in (2, 5)), slot
