"""The KV connector seam (docs/pd.md#the-connector): the runner loads KV for exactly the
plan's imported ids, through the connector's execution side, and nothing else; the
engine hands the blocks the plan held to the connector's request side, gives back those
it will not take next pass, and those it is done with when it says so; the plans state
both."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from genpool_core.kv_blocks import KVBudget
from genpool_core.plan import GenPlan
from genpool_core.preemption import GenCapacity
from genpool_core.request import FinishReason
from genpool_core.scheduler import GenScheduler, SchedulerConfig
from genpool_worker.engine import GenEngine
from genpool_worker.engine_io import Arrival, EngineRequest
from genpool_worker.kv_connector import KVTransfer
from genpool_worker.kv_layout import KVLayout
from tests.worker.test_engine_parts import ByteTokenizer, RecordingModel

FIRST = 6  # the loaded request's first token, made elsewhere


class FakeConnector:
    """Records what the engine and the runner ask; ``keeps`` held blocks when asked to."""

    def __init__(self, *, keeps: bool = True) -> None:
        self.keeps = keeps
        self.calls: list[tuple[str, object]] = []
        self.done: list[str] = []  # what take_released hands back next

    def on_queued(self, arrival: Arrival) -> None:
        self.calls.append(("queued", arrival.request_id))

    def on_held(self, request: EngineRequest, blocks: tuple[int, ...]) -> bool:
        self.calls.append(("held", (request.request_id, blocks)))
        return self.keeps

    def drop(self, arrival: Arrival) -> None:
        self.calls.append(("drop", arrival.request_id))

    def take_released(self) -> list[str]:
        done, self.done = self.done, []
        return done

    def set_wake(self, wake: Callable[[], None]) -> None:
        self.calls.append(("set_wake", None))

    def load_kv(self, request_id: str, blocks: tuple[int, ...]) -> int:
        self.calls.append(("load", (request_id, blocks)))
        return FIRST

    def kv_layout(self) -> KVLayout | None:
        return None

    def read_kv(self, blocks: Sequence[int]) -> Iterator[bytes]:
        return iter(())


class Plans:
    def __init__(self) -> None:
        self.plans: list[GenPlan] = []

    def on_plan(self, plan: GenPlan) -> None:
        self.plans.append(plan)

    def on_finished(self, request: EngineRequest, reason: FinishReason) -> None:
        pass


def test_the_runner_loads_the_plans_imported_ids_and_no_other() -> None:
    model = RecordingModel()
    runner = model.runner()
    runner.add_request(Arrival("local", [1, 2], 8))
    runner.add_request(Arrival("loaded", [3], 8, kv_transfer=KVTransfer(first_token=FIRST)))
    connector = FakeConnector()
    plan = GenPlan(0.0, ("local", "loaded"), (0, 1), ("local",), (), (), ("local", "loaded"),
                   ((2,), (5, 7)), (), (), (), (), imported_ids=("loaded",))  # fmt: skip
    assert runner.execute(plan, connector).tokens == {"local": 3, "loaded": FIRST + 1}
    assert connector.calls == [("load", ("loaded", (5, 7)))]
    # It decodes from the loaded first token at the position after its prompt.
    assert model.calls[-1] == ("decode", ([(5, 7)], [FIRST], [1]))


def test_a_request_the_connector_cannot_load_fails_alone() -> None:
    runner = RecordingModel().runner()
    runner.add_request(Arrival("local", [1], 8))
    runner.add_request(Arrival("loaded", [3], 8, kv_transfer=KVTransfer(first_token=FIRST)))
    plan = GenPlan(0.0, ("local", "loaded"), (0, 1), ("local",), (), (), ("local", "loaded"),
                   ((2,), (5,)), (), (), (), (), imported_ids=("loaded",))  # fmt: skip
    result = runner.execute(plan)  # the colocated default: nothing to load
    assert result.tokens == {"local": 2}
    assert "no KV to load" in result.failed["loaded"]


def _engine(connector: FakeConnector) -> tuple[GenEngine, Plans]:
    model = RecordingModel()
    config = SchedulerConfig(kv_budget=KVBudget(16, model.kv.block_size))
    scheduler = GenScheduler.from_settings({}, GenCapacity(max_batch_size=4), config)
    plans = Plans()
    ticks = iter(range(1, 1000))
    engine = GenEngine(model.runner(), ByteTokenizer(), scheduler,
                       clock=lambda: 0.1 * next(ticks), observer=plans,
                       kv_connector=connector)  # fmt: skip
    return engine, plans


def _pass(engine: GenEngine) -> None:
    engine.step(engine._collect())


def test_the_engine_hands_held_blocks_over_and_gives_them_back_when_told() -> None:
    connector = FakeConnector(keeps=True)
    engine, plans = _engine(connector)
    leg = Arrival("leg", [1, 2, 3, 4, 5], 1, kv_transfer=KVTransfer(holds_kv_at_finish=True))
    loaded = Arrival("loaded", [3], 3, kv_transfer=KVTransfer(first_token=FIRST))
    assert connector.calls == [("set_wake", None)]  # its releases wake an idle loop
    engine.submit(EngineRequest(leg), EngineRequest(loaded))
    _pass(engine)
    admission = plans.plans[-1]
    assert admission.imported_ids == ("loaded",)
    loaded_blocks = admission.admitted_blocks[admission.admitted_ids.index("loaded")]
    leg_blocks = admission.admitted_blocks[admission.admitted_ids.index("leg")]
    assert ("queued", "leg") in connector.calls and ("queued", "loaded") in connector.calls
    assert ("load", ("loaded", loaded_blocks)) in connector.calls
    _pass(engine)  # the leg's one token ended it: its blocks are held and handed over
    assert plans.plans[-1].held_ids == ("leg",)
    assert ("held", ("leg", leg_blocks)) in connector.calls
    assert engine.scheduler.kv.held_ids() == ("leg",)
    _pass(engine)
    assert plans.plans[-1].released_held_ids == ()  # the connector still holds them
    connector.done = ["leg"]
    _pass(engine)
    assert plans.plans[-1].released_held_ids == ("leg",)
    assert engine.scheduler.kv.held_ids() == ()
    assert connector.calls.count(("load", ("loaded", loaded_blocks))) == 1


def test_held_blocks_nobody_takes_go_back_next_pass() -> None:
    connector = FakeConnector(keeps=False)
    engine, plans = _engine(connector)
    leg = Arrival("leg", [1, 2], 1, kv_transfer=KVTransfer(holds_kv_at_finish=True))
    engine.submit(EngineRequest(leg))
    _pass(engine)
    _pass(engine)
    assert plans.plans[-1].held_ids == ("leg",)
    _pass(engine)
    assert plans.plans[-1].released_held_ids == ("leg",)
    assert engine.scheduler.kv.held_ids() == () and engine.scheduler.kv.num_used == 0
