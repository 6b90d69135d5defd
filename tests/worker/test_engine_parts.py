"""The engine's parts on their own: the model runner follows the plan's prefill ids,
the output processor streams only complete text and closes with the plan's reason,
and the engine hands each request's own SLO to the scheduler."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

import pytest
import torch

from genpool_core.plan import GenPlan
from genpool_core.preemption import GenCapacity
from genpool_core.request import FinishReason
from genpool_core.scheduler import GenScheduler
from genpool_core.statline import format_statline, make_statline
from genpool_worker.engine import GenEngine
from genpool_worker.engine_io import Arrival, EngineRequest
from genpool_worker.events import EngineEvent, Finished, Rejected, TokenDelta, Usage
from genpool_worker.model.kv_cache import PrefillSpan
from genpool_worker.model_runner import TorchModelRunner
from genpool_worker.output_processor import OutputProcessor
from genpool_worker.sampling_params import SamplingParams
from genpool_worker.synthetic import SyntheticKVCache

VOCAB = 8


class RecordingModel:
    """Logits that pick ``(last input token + 1) % VOCAB``; records every call (and that
    each pass got the runner's cache)."""

    name = "fake"
    is_synthetic = True
    eos_token_ids = (0,)
    max_seq_len = 64

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.kv = SyntheticKVCache(self.name, num_blocks=16, block_size=4)

    def runner(self) -> TorchModelRunner[torch.Tensor]:
        return TorchModelRunner(self, self.kv)

    def prefill_many(self, cache: torch.Tensor, spans: Sequence[PrefillSpan]) -> torch.Tensor:
        assert cache is self.kv.cache and all(span.start == 0 for span in spans)
        self.calls.append(("prefill", [(tuple(s.blocks), list(s.token_ids)) for s in spans]))
        nxt = torch.tensor([(span.token_ids[-1] + 1) % VOCAB for span in spans])
        return torch.nn.functional.one_hot(nxt, VOCAB).float()

    def decode(
        self,
        cache: torch.Tensor,
        block_tables: Sequence[Sequence[int]],
        token_ids: list[int],
        positions: list[int],
    ) -> torch.Tensor:
        assert cache is self.kv.cache
        tables = [tuple(t) for t in block_tables]
        self.calls.append(("decode", (tables, list(token_ids), list(positions))))
        nxt = torch.tensor([(t + 1) % VOCAB for t in token_ids])
        return torch.nn.functional.one_hot(nxt, VOCAB).float()


def plan(
    batch: tuple[str, ...],
    slots: tuple[int, ...],
    prefill: tuple[str, ...],
    blocks: dict[str, tuple[int, ...]] | None = None,
) -> GenPlan:
    """A plan whose admissions are ``blocks``' keys, with those block tables."""
    admitted = blocks or {}
    return GenPlan(0.0, batch, slots, prefill, (), (), tuple(admitted),
                   tuple(admitted.values()), (), (), (), (), None)  # fmt: skip


def test_runner_prefills_the_plans_prefill_ids_and_decodes_the_rest() -> None:
    model = RecordingModel()
    runner = model.runner()
    runner.add_request(Arrival("a", [3, 4], 8))
    runner.add_request(Arrival("b", [5], 8))
    assert runner.execute(plan(("a",), (0,), ("a",), {"a": (2, 0)})).tokens == {"a": 5}
    mixed = plan(("a", "b"), (0, 1), ("b",), {"b": (1, 3)})
    assert runner.execute(mixed).tokens == {"b": 6, "a": 6}
    assert model.calls == [
        ("prefill", [((2, 0), [3, 4])]),
        ("prefill", [((1, 3), [5])]),
        ("decode", ([(2, 0)], [5], [2])),  # a's first output token sits at position 2
    ]
    runner.remove_request("a")
    assert runner.execute(plan(("b",), (1,), ())).tokens == {"b": 7}
    assert model.calls[-1] == ("decode", ([(1, 3)], [6], [1]))


def test_runner_prefills_a_passes_prompts_in_forwards_of_up_to_max_seq_len_tokens() -> None:
    model = RecordingModel()
    runner = model.runner()
    for rid, prompt in (("a", [1, 2]), ("b", [3]), ("c", [4] * 62)):
        runner.add_request(Arrival(rid, prompt, 1))
    tables = {"a": (0,), "b": (1,), "c": tuple(range(2, 16))}
    step = runner.execute(plan(("a", "b", "c"), (0, 1, 2), ("a", "b", "c"), tables))
    assert step.tokens == {"a": 3, "b": 4, "c": 5}
    # a and b in one forward; c's 62 tokens would take it past max_seq_len (64): its own
    assert model.calls == [
        ("prefill", [((0,), [1, 2]), ((1,), [3])]),
        ("prefill", [(tables["c"], [4] * 62)]),
    ]


def test_seeded_sampling_is_reproducible_per_request() -> None:
    def draw(seed: int | None) -> list[int]:
        runner = RecordingModel().runner()
        runner.add_request(Arrival("r", [1], 8, SamplingParams(temperature=2.0, seed=seed)))
        tokens = [runner.execute(plan(("r",), (0,), ("r",), {"r": (0,)})).tokens["r"]]
        tokens += [runner.execute(plan(("r",), (0,), ())).tokens["r"] for _ in range(5)]
        return tokens

    assert draw(7) == draw(7)
    assert draw(None) == draw(None)  # no seed: derived from the request id, still stable


class ByteTokenizer:
    eos_token_id = 0

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i).decode("utf-8", errors="replace")


def drain(request: EngineRequest) -> list[EngineEvent]:
    events = []
    while not request.events.empty():
        events.append(request.events.get_nowait())
    return events


def test_output_waits_for_complete_utf8_and_closes_with_the_plans_reason() -> None:
    loop = asyncio.new_event_loop()
    try:
        request = EngineRequest(Arrival("r", [65], 5), loop=loop)
        output = OutputProcessor(ByteTokenizer(), eos_token_ids=(0,))
        for token in [104, 0xC3, 0xA9, 0]:  # "h", then "é" in two bytes, then EOS
            output.on_token(request, token)
        output.on_finished(request, FinishReason.STOP)
        loop.run_until_complete(asyncio.sleep(0))  # deliver the thread-safe callbacks
        assert drain(request) == [
            TokenDelta("h", num_output_tokens=1),
            TokenDelta("é", num_output_tokens=3),  # held until its second byte, the 3rd token
            Finished(FinishReason.STOP, Usage(prompt_tokens=1, completion_tokens=4)),
        ]
    finally:
        loop.close()


class CharTokenizer:
    eos_token_id = 0

    def encode(self, text: str) -> list[int]:
        return [1 + ord(c) % (VOCAB - 1) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + i) for i in ids)


def test_engine_counts_each_request_against_its_own_output_floor() -> None:
    """Off mode has no pool floor: only requests that bring a T_i are counted, each
    against its own (an unreachable floor is missed, a loose one met)."""
    ticks = iter(range(1, 1000))
    scheduler = GenScheduler.from_settings({}, GenCapacity(max_batch_size=4))
    engine = GenEngine(
        RecordingModel().runner(),
        CharTokenizer(),
        scheduler,
        clock=lambda: 0.1 * next(ticks),
    )
    arrivals = [
        Arrival("tight", [1], 5, arrival_time=0.0, target_output_tps=1e6),
        Arrival("loose", [1], 5, arrival_time=0.0, target_output_tps=0.01),
        Arrival("pool", [1], 5, arrival_time=0.0),
    ]
    for arrival in arrivals:
        engine.submit(EngineRequest(arrival))
    for _ in range(12):  # five tokens each, one per pass, all three in one batch
        engine.step(engine._collect())
    stats = scheduler.make_stats(engine._now())
    assert not engine._requests  # all three finished
    assert stats.completed == 3
    assert (stats.slo_completed, stats.below_target) == (2, 1)
    line = format_statline(make_statline(stats, None))
    assert "below_target=0.500/0.500" in line


@pytest.mark.parametrize(
    ("field", "value"),
    [("target_output_tps", -1.0), ("slo_ttft_s", 0.0), ("slo_ttft_s", math.inf)],
)
def test_engine_rejects_a_bad_per_request_slo(field: str, value: float) -> None:
    scheduler = GenScheduler.from_settings({}, GenCapacity(max_batch_size=4))
    engine = GenEngine(RecordingModel().runner(), CharTokenizer(), scheduler)
    request = EngineRequest(Arrival("bad", [1], 5, arrival_time=0.0, **{field: value}))
    request.loop = asyncio.new_event_loop()
    try:
        engine.submit(request)
        engine.step(engine._collect())
        request.loop.run_until_complete(asyncio.sleep(0))
        event = request.events.get_nowait()
    finally:
        request.loop.close()
    assert isinstance(event, Rejected)
    assert event.status == 400 and field in event.message
