"""The GEN engine loop: each pass schedules (``GenScheduler.step``), runs the model
runner on the plan, and processes the outputs (stream text, finish requests).

One thread owns the scheduler and the runner; HTTP handlers talk to it only through
``submit`` / ``abort`` / ``reconfigure`` (thread-safe inboxes) and read the snapshot it
publishes after every pass. Events go back through each request's asyncio queue. The
loop imports no torch: every model decision is the runner's, every scheduling
decision (prefill or decode, finish reasons, every KV move) the plan's; KV that comes
from or goes to elsewhere moves through the engine's KV connector (``kv_connector``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from genpool_core.block_hash import extend_hashes
from genpool_core.live import LiveUpdate
from genpool_core.names import RECENT_STAT_LINES
from genpool_core.plan import GenPlan
from genpool_core.request import FinishReason
from genpool_core.scheduler import GenScheduler
from genpool_core.statline import StatLine, make_statline
from genpool_worker.config_view import config_view
from genpool_worker.engine_io import (
    Coordinator,
    EngineObserver,
    EngineRequest,
    EngineSnapshot,
    KVEventSink,
    LocalCoordinator,
    ModelRunner,
    PassInputs,
    StepResult,
    Tokenizer,
)
from genpool_worker.engine_requests import RequestLifecycle
from genpool_worker.events import Failed
from genpool_worker.kv_connector import KVConnector, NoKVConnector
from genpool_worker.output_processor import OutputProcessor
from genpool_worker.request_faults import describe
from genpool_worker.speculative import SpecDecodeCounts

STAT_LOGGER = logging.getLogger("genpool.gen_preemption")
log = logging.getLogger("genpool.worker")
IDLE_PASS_S = 0.25  # an idle worker still passes, so its stat line keeps coming


_Pending = tuple[GenPlan, tuple[str, ...], dict[str, int], dict[str, int], dict[str, list[int]]]


class GenEngine(RequestLifecycle):
    def __init__(
        self,
        runner: ModelRunner,
        tokenizer: Tokenizer,
        scheduler: GenScheduler,
        *,
        clock: Callable[[], float] = time.time,
        on_step: Callable[[float, int], None] | None = None,
        coordinator: Coordinator | None = None,
        observer: EngineObserver | None = None,
        kv_connector: KVConnector | None = None,
    ) -> None:
        """``kv_connector``: moves the KV the plans load, hold and release (None: a
        colocated worker's, which moves none)."""
        self.runner = runner
        self.model_info = runner.info
        self.scheduler = scheduler
        self.coordinator: Coordinator = coordinator or LocalCoordinator()
        self.output = OutputProcessor(tokenizer, runner.info.eos_token_ids)
        self._clock = clock
        self._on_step = on_step
        self._observer = observer
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._inbox: list[EngineRequest] = []
        self._aborts: list[str] = []
        self.kv_connector: KVConnector = kv_connector or NoKVConnector()
        self.kv_connector.set_wake(self._wake.set)  # a release wakes an idle loop
        self._unheld: list[str] = []  # held at finish, but nobody takes them: next pass
        self.kv_events: KVEventSink | None = None  # the KV event publisher, when configured
        self.spec_decode = SpecDecodeCounts()  # drafts verified and accepted (metrics.py)
        self._configs: list[tuple[LiveUpdate, Future[dict[str, Any]]]] = []
        self._config_futures: list[Future[dict[str, Any]]] = []
        self._requests: dict[str, EngineRequest] = {}
        # The last pass's plan, who ended on a stop, who emitted more than one token, the
        # drafts each verified, and the drafts proposed for each one's next step.
        self._pending: _Pending | None = None
        self._prev_end: float | None = None
        self._last_now = 0.0
        self._inflight = 0
        self._tokens_total = 0
        self._passes = 0
        # The periodic lines a controller has not necessarily read: it counts each once.
        self._recent_stats: tuple[StatLine, ...] = ()
        self.is_draining = False
        self.error: BaseException | None = None
        self._is_dead = False  # set under the lock: no request is queued after it
        self._failures: dict[str, str] = {}  # failed alone in the engine, finished next pass
        # Called once, on the engine thread, when the loop died (the CLI exits the process).
        self.on_death: Callable[[BaseException], None] | None = None
        self._running = False
        self._thread = threading.Thread(target=self.run, name="genpool-engine", daemon=True)
        self.snapshot = self._make_snapshot(self._now())

    # -- API for other threads ------------------------------------------------------

    def start(self) -> None:
        """Run the loop in a background thread (rank 0, next to the HTTP server)."""
        self._running = True
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """End the loop; whatever is still open fails at once (503), never hangs."""
        self._running = False
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._fail_everything("worker stopped")

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    @property
    def inflight(self) -> int:
        return self._inflight

    def submit(self, *requests: EngineRequest) -> None:
        """Queue ``requests`` together: the next pass reads all of them or none. Once the
        loop is dead or stopped they fail at once (503) instead of waiting forever."""
        with self._lock:
            is_dead = self._is_dead
            if not is_dead:
                self._inbox.extend(requests)
                self._inflight += len(requests)
        if is_dead:
            for request in requests:
                request.emit(Failed(f"engine stopped: {self.error or 'worker stopped'}"))
            return
        self._wake.set()

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborts.append(request_id)
        self._wake.set()

    def reconfigure(self, update: LiveUpdate) -> Future[dict[str, Any]]:
        future: Future[dict[str, Any]] = Future()
        with self._lock:
            self._configs.append((update, future))
        self._wake.set()
        return future

    # -- the loop ---------------------------------------------------------------------

    def _now(self) -> float:
        # Wall clock (clients send arrival times in it), never allowed to go back.
        self._last_now = max(self._last_now, self._clock())
        return self._last_now

    def run(self) -> None:
        """The loop; followers (ranks > 0) call it directly and block on the exchange."""
        self._running = True
        try:
            while True:
                is_leader = self.coordinator.rank == 0
                inputs = self.coordinator.exchange(self._collect() if is_leader else None)
                if inputs.stop:
                    return
                self.step(inputs)
        except BaseException as exc:  # the worker must report, not hang: /health goes red
            self.error = exc
            log.exception("engine loop died")
            self._fail_everything(f"engine failure: {exc}")
            if self.on_death is not None:
                self.on_death(exc)
            if self.coordinator.rank != 0:
                raise

    def _fail_everything(self, message: str) -> None:
        """Every waiting, running and new request fails at once with a 503."""
        with self._lock:
            self._is_dead = True
            pending = list(self._requests.values()) + self._inbox
            self._requests, self._inbox = {}, []
            self._inflight = 0
        for request in pending:
            request.emit(Failed(message))
            self.kv_connector.drop(request.arrival)

    def _collect(self) -> PassInputs:
        """Rank 0: this pass's inputs from the clock and the inboxes."""
        if not (self.scheduler.num_residents or self.scheduler.num_waiting or self._inbox):
            self._wake.wait(IDLE_PASS_S)
            self._wake.clear()
        # Held blocks nobody takes, and those the connector is done with (it sweeps here).
        releases = [*self._unheld, *self.kv_connector.take_released()]
        self._unheld = []
        with self._lock:
            inbox, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, []
            configs, self._configs = self._configs, []
        for request in inbox:
            self._requests[request.request_id] = request
        self._config_futures = [future for _, future in configs]
        return PassInputs(
            now=self._now(),
            prev_end=self._prev_end,
            arrivals=[request.arrival for request in inbox],
            aborts=aborts,
            configs=[update for update, _ in configs],
            kv_releases=releases,
            stop=not self._running,
        )

    def step(self, inputs: PassInputs) -> None:
        """One pass: finish the previous model step, apply inputs, schedule, run, stream."""
        if self._pending is not None:
            previous, stops, counts, drafted, drafts = self._pending
            self._pending = None
            assert inputs.prev_end is not None
            self.scheduler.postprocess(previous, inputs.prev_end, stops, counts, drafted, drafts)
        self._apply(inputs)
        plan = self._schedule(inputs.now)
        started = time.perf_counter()
        result = self.runner.execute(plan, self.kv_connector) if plan.batch_ids else StepResult({})
        for request_id, message in result.failed.items():
            self._fail_alone(request_id, message)
        tokens = result.tokens
        self._prev_end = self._now()
        # When its prefill began (its first chunk's pass): an export's timings report it.
        first_chunks = [rid for rid, start, _ in plan.prefill_chunks if start == 0]
        for request_id in (*plan.prefill_ids, *first_chunks):
            prefilling = self._requests[request_id]
            prefilling.prefill_started_at = prefilling.prefill_started_at or plan.now
        for request_id in tokens:  # the first token this worker produced (TTFT's parts)
            self._requests[request_id].first_token_at = (
                self._requests[request_id].first_token_at or self._prev_end
            )
        emitted, stops = self._emit(result)
        self._track_cache(plan, emitted)
        # The next pass postprocesses at this step's end (``prev_end``): no extra wait here.
        if tokens:
            counts = {rid: len(ids) for rid, ids in emitted.items() if len(ids) > 1}
            drafts = {rid: d for rid, d in result.drafts.items() if rid in emitted}
            self._pending = (plan, stops, counts, result.drafted, drafts)
        else:
            self.scheduler.postprocess(plan, inputs.now)
        self._tokens_total += sum(len(ids) for ids in emitted.values())
        self._passes += 1
        if plan.batch_ids and self._on_step is not None:
            self._on_step(time.perf_counter() - started, len(plan.batch_ids))
        self.snapshot = self._make_snapshot(inputs.now)

    def _emit(self, result: StepResult) -> tuple[dict[str, list[int]], tuple[str, ...]]:
        """Each request's tokens to its stream, in order, up to the first that ends it:
        what each emitted, and who ended on a stop (EOS, a stop token or string)."""
        eos = self.model_info.eos_token_ids
        emitted: dict[str, list[int]] = {}
        stops: list[str] = []
        for request_id, token in result.tokens.items():
            request = self._requests[request_id]
            ids = [*result.accepted.get(request_id, ()), token]
            logprobs = result.logprobs.get(request_id)
            last = len(ids) - 1
            for i, each in enumerate(ids):
                try:
                    self.output.on_token(request, each, logprobs if i == last else None)
                except Exception as exc:  # its text cannot be made: it fails, the others go on
                    self._fail_alone(request_id, describe(exc))
                    ids = ids[: i + 1]
                    break
                if request.is_stopped_by(each, eos):
                    ids = ids[: i + 1]
                    stops.append(request_id)
                    break
            emitted[request_id] = ids
        if result.drafted:
            self.spec_decode.count(result.drafted, result.accepted)
        return emitted, tuple(stops)

    def _schedule(self, now: float) -> GenPlan:
        plan = self.scheduler.step(now)
        if self._observer is not None:
            self._observer.on_plan(plan)
        events = self.scheduler.kv.take_events()
        if events and self.kv_events is not None:  # before the finished requests go
            self.kv_events.publish(events, self._tokens_of)
        held = set(plan.held_ids)
        for request_id, reason in zip(plan.finished_ids, plan.finish_reasons, strict=True):
            self._finish(request_id, reason, is_held=request_id in held)
        if plan.stat is not None:
            # A new tuple only when a line is cut: the snapshot after every pass shares it.
            self._recent_stats = (*self._recent_stats, plan.stat)[-RECENT_STAT_LINES:]
            if self.coordinator.rank == 0:
                STAT_LOGGER.info(plan.stat_line)
        return plan

    def _apply(self, inputs: PassInputs) -> None:
        for request_id in inputs.kv_releases:
            self.scheduler.release_held(request_id)
        for arrival in inputs.arrivals:
            request = self._requests.get(arrival.request_id) or EngineRequest(arrival)
            self._admit_to_queue(request, inputs.now)
        for request_id in inputs.aborts:
            if request_id in self._requests:
                is_waiting = request_id in self.scheduler.queue
                self.scheduler.abort(request_id)
                if is_waiting:  # a waiter leaves at once: it will be in no plan
                    self._finish(request_id, FinishReason.ABORT)
        futures = self._config_futures or [Future() for _ in inputs.configs]
        self._config_futures = []
        for update, future in zip(inputs.configs, futures, strict=True):
            try:
                self.scheduler.reconfigure(self.scheduler.live_config().updated(update))
                future.set_result(self.config())
            except (ValueError, TypeError) as exc:
                future.set_exception(exc)

    # -- views ------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        return config_view(self.scheduler)

    def _make_snapshot(self, now: float) -> EngineSnapshot:
        stats = self.scheduler.make_stats(now)
        recent = self._recent_stats
        stat = recent[-1] if recent else make_statline(stats, None)
        speculating = self.scheduler.config.num_speculative_tokens > 0
        spec = self.spec_decode.copy() if speculating else None
        return EngineSnapshot(
            stats, stat, self.config(), self._inflight, self._tokens_total, self._passes,
            self._recent_stats, spec,
        )  # fmt: skip

    def _tokens_of(self, request_id: str) -> list[int]:
        """A request's tokens so far, prompt first (its KV events' token ids)."""
        request = self._requests[request_id]
        return [*request.arrival.prompt_ids, *request.output_ids]

    def _track_cache(self, plan: GenPlan, emitted: dict[str, list[int]]) -> None:
        """What the prefix cache gave each admission (its reply's ``cached_tokens``), and
        the hashes of output blocks that filled this pass (shared once it ends)."""
        for request_id, cached in zip(plan.admitted_ids, plan.admitted_cached_tokens,
                                      strict=True):  # fmt: skip
            self._requests[request_id].num_cached_tokens = cached
        if not self.scheduler.kv.is_caching:
            return
        size = self.model_info.kv_block_size
        for request_id in emitted:
            request = self._requests[request_id]
            gen = request.gen
            num_tokens = len(request.arrival.prompt_ids) + len(request.output_ids)
            if gen is not None and num_tokens >= (len(gen.block_hashes) + 1) * size:
                extend_hashes(gen.block_hashes, self._tokens_of(request_id), size)
