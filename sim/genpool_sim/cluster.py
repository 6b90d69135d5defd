"""The simulated disaggregated pool: context stage, router, W GEN workers.

A tiny event loop (heap of (time, priority, seq, kind, payload)); ties break by
priority (requests and passes first, then :class:`Tick` callbacks such as phase
starts, tuner and scaler rounds, in their order) and then insertion order, so a run
is a pure function of its inputs and seed. Workers come and go: a new one serves
after its start-up delay, a drained one stops admitting, hands its waiters back to
the router and retires when its residents have finished. Each GEN worker drives
the core's :class:`GenScheduler` unchanged: ``step(now)``, step time from the
step model, ``postprocess``; with ``kv_blocks`` each worker's scheduler reserves KV
blocks (the core's ``KVAccount``) and a :class:`KVGauge` measures them. The
``recompute`` baseline (``genpool_sim.recompute``) evicts instead of pausing.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable

from genpool_core.plan import GenPlan
from genpool_core.preemption import GenCapacity
from genpool_core.request import FinishReason, GenRequest
from genpool_core.scheduler import GenScheduler, SchedulerConfig
from genpool_sim.cluster_config import ClusterConfig as ClusterConfig
from genpool_sim.gen_pass import fill_hashes, pass_seconds, route
from genpool_sim.kv_memory import KVGauge
from genpool_sim.modes import MODES as MODES
from genpool_sim.modes import RECOMPUTE_MODE as RECOMPUTE_MODE
from genpool_sim.modes import SimMode
from genpool_sim.recompute import evict_for_at_risk, requeue_evicted
from genpool_sim.records import SimRequest
from genpool_sim.replica import GenWorker, Tick
from genpool_sim.speculation import proposed, verified

_ARRIVAL, _CTX_DONE, _WORKER, _READY, _TICK, _PULLED = 0, 1, 2, 3, 4, 5


class Cluster:
    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.workers = [GenWorker(i, self._new_scheduler()) for i in range(config.workers)]
        self.requests: dict[str, SimRequest] = {}
        self.stat_lines: list[tuple[int, str]] = []
        self.on_done: Callable[[SimRequest, float], None] | None = None
        # a controller configures a worker that has just started (the tuner's knobs)
        self.on_ready: Callable[[GenWorker], None] | None = None
        self.tokens_by_time: list[tuple[float, int]] = []
        self._events: list[tuple[float, int, int, int, SimRequest | GenWorker | Tick]] = []
        self._seq = 0
        self._ctx_queue: deque[SimRequest] = deque()
        self._ctx_free = config.ctx_servers
        self.now = 0.0
        # KV use, measured only when the workers have a budget (over the gauge's window)
        self.kv_gauge = None if config.kv_blocks is None else KVGauge()

    def _new_scheduler(self) -> GenScheduler:
        config = self.config
        sched_config = SchedulerConfig(
            max_queue_length=1_000_000,
            stat_interval_s=config.stat_interval_s,
            kv_budget=config.kv_budget,
            enable_prefix_caching=config.prefix_caching,
            num_speculative_tokens=config.num_speculative_tokens,
        )
        capacity = GenCapacity(config.max_batch)
        return GenScheduler.from_settings(config.settings(), capacity, sched_config)

    def schedule(self, at: float, kind: int, payload: SimRequest | GenWorker | Tick) -> None:
        self._seq += 1
        priority = 1 + payload.order if isinstance(payload, Tick) else 0
        heapq.heappush(self._events, (at, priority, self._seq, kind, payload))

    def at(self, time: float, callback: Callable[[float], None], order: int = 0) -> None:
        self.schedule(time, _TICK, Tick(callback, order))

    def submit(self, request: SimRequest) -> None:
        self.requests[request.request_id] = request
        self.schedule(request.arrival, _ARRIVAL, request)

    def run(self, until: float = float("inf")) -> None:
        events = self._events
        while events and events[0][0] <= until:
            at, _, _, kind, payload = heapq.heappop(events)
            self.now = at
            if isinstance(payload, Tick):
                payload.callback(at)
            elif isinstance(payload, SimRequest):
                if kind == _ARRIVAL and self.config.colocated:  # the GEN worker prefills
                    payload.gen_arrival = payload.arrival
                    self._route(payload)
                elif kind == _ARRIVAL:
                    self._ctx_queue.append(payload)
                    self._start_prefills()
                elif kind == _CTX_DONE:
                    self._ctx_free += 1
                    self._start_prefills()
                    self._to_gen(payload)
                else:  # _PULLED: its KV is in, it queues (keyed at its handoff)
                    self._route(payload)
            elif kind == _READY:
                self._ready(payload)
            else:
                self._worker_pass(payload)

    # -- workers coming and going ------------------------------------------------------

    def serving_workers(self) -> list[GenWorker]:
        return [worker for worker in self.workers if worker.is_serving]

    def add_worker(self, startup_delay_s: float) -> GenWorker:
        """A new replica: it counts from now and serves after its start-up delay."""
        worker = GenWorker(len(self.workers), self._new_scheduler(), started_at=self.now)
        worker.is_ready = False
        self.workers.append(worker)
        self.schedule(self.now + startup_delay_s, _READY, worker)
        return worker

    def remove_worker(self) -> GenWorker | None:
        """Take one replica away: a starting one is cancelled, else the newest drains.

        The last routable worker is never drained (the router needs somewhere to send).
        """
        starting = [w for w in self.workers if not w.is_ready and w.retired_at is None]
        if starting:
            worker = starting[-1]
            worker.retired_at = self.now
            return worker
        routable = [w for w in self.workers if w.is_routable]
        if len(routable) <= 1:
            return None
        worker = routable[-1]
        worker.is_draining = True
        self._return_waiters(worker)
        if not worker.is_busy:
            self._retire_if_empty(worker)
        return worker

    def scale_to(self, desired: int, startup_delay_s: float) -> None:
        """Add replicas (serving after the start-up delay) or take them away until
        ``desired`` neither retire nor drain."""
        current = sum(1 for w in self.workers if w.retired_at is None and not w.is_draining)
        for _ in range(desired - current):
            self.add_worker(startup_delay_s)
        for _ in range(current - desired):
            if self.remove_worker() is None:
                break

    def _ready(self, worker: GenWorker) -> None:
        if worker.retired_at is None:  # not cancelled while it was starting
            worker.is_ready = True
            if self.on_ready is not None:
                self.on_ready(worker)

    def _return_waiters(self, worker: GenWorker) -> None:
        scheduler = worker.scheduler
        waiting = [r for r in self.requests.values()
                   if r.worker == worker.index and r.gen is not None
                   and r.gen.request_id in scheduler.queue]  # fmt: skip
        for request in waiting:
            scheduler.abort(request.request_id)
            self._route(request)

    def _retire_if_empty(self, worker: GenWorker) -> None:
        scheduler = worker.scheduler
        if worker.is_draining and scheduler.num_residents == 0 and scheduler.num_waiting == 0:
            worker.retired_at = self.now

    def replica_seconds(self, start: float, end: float) -> float:
        """Replica time inside [start, end], start-up and draining included."""
        return sum(worker.seconds_within(start, end) for worker in self.workers)

    # -- context stage and router ---------------------------------------------------

    def _start_prefills(self) -> None:
        while self._ctx_free and self._ctx_queue:
            request = self._ctx_queue.popleft()
            self._ctx_free -= 1
            done = self.now + self.config.step_model.prefill_time(request.prompt_tokens)
            self.schedule(done, _CTX_DONE, request)

    def _to_gen(self, request: SimRequest) -> None:
        request.first_token_time = self.now
        if request.output_tokens <= 1:
            request.last_token = self.now
            self._finish(request)
            return
        # As a decode worker keys a pulled request (docs/pd.md): at its handoff, with
        # the pull's time counted in its wait before it can queue.
        request.gen_arrival = self.now
        pull_s = self.config.kv_transfer_s_per_token * request.prompt_tokens
        if pull_s > 0:
            self.schedule(self.now + pull_s, _PULLED, request)
        else:
            self._route(request)

    def _route(self, request: SimRequest) -> None:
        """To the least loaded routable worker; a returned waiter keeps its GEN arrival."""
        config = self.config
        worker = route([w for w in self.workers if w.is_routable], request, config.router)
        request.worker = worker.index
        prompt_blocks = request.block_hashes[: request.prompt_tokens // config.kv_block_size]
        request.gen = GenRequest(
            request_id=request.request_id,
            prompt_len=request.prompt_tokens,
            max_tokens=request.output_tokens,
            arrival_time=request.gen_arrival,
            first_token_time=request.first_token_time,
            slo_ttft_s=request.slo_ttft_s,
            target_output_tps=request.target_output_tps,
            num_output_tokens=0 if config.colocated else 1,
            block_hashes=list(prompt_blocks) if config.prefix_caching else [],
        )
        worker.scheduler.add_request(request.gen, self.now)
        self._wake(worker)

    def _wake(self, worker: GenWorker) -> None:
        if not worker.is_busy:
            worker.is_busy = True
            self.schedule(self.now, _WORKER, worker)

    def _finish(self, request: SimRequest) -> None:
        request.is_done = True
        if self.on_done is not None:
            self.on_done(request, self.now)

    # -- one GEN worker pass ------------------------------------------------------

    def _worker_pass(self, worker: GenWorker) -> None:
        now, scheduler = self.now, worker.scheduler
        if worker.plan is not None:
            emitted, drafted = worker.emitted, worker.drafted
            worker.emitted, worker.drafted = {}, {}
            drafts = proposed(worker.plan, self.config.num_speculative_tokens)
            scheduler.postprocess(worker.plan, now, (), emitted, drafted, drafts)
            if self.config.prefix_caching:  # before the next pass releases the finished
                fill_hashes(worker.plan, self.requests, self.config.kv_block_size)
            if worker.plan.batch_ids:
                tokens = len(worker.plan.batch_ids) + sum(emitted.values()) - len(emitted)
                self.tokens_by_time.append((now, tokens))
            worker.plan = None
        if self.config.kind is SimMode.RECOMPUTE:
            limit = self.config.max_evictions_per_request
            evict_for_at_risk(worker, self.requests, now, limit)
        plan = scheduler.step(now)
        scheduler.kv.take_events()  # nobody subscribes to the simulator's KV events
        self._record(worker, plan)
        if plan.stat_line is not None:
            self.stat_lines.append((worker.index, plan.stat_line))
        if not plan.batch_ids:
            scheduler.postprocess(plan, now)
            worker.is_busy = False
            self._retire_if_empty(worker)
            return
        worker.plan = plan
        if plan.drafts:
            requests = self.requests
            gens = {rid: gen for rid in plan.batch_ids if (gen := requests[rid].gen) is not None}
            worker.emitted, worker.drafted = verified(plan, gens, self.config.acceptance_rate)
        step_s = pass_seconds(self.config.step_model, plan, self.requests,
                              worker.recompute_tokens)  # fmt: skip
        if self.kv_gauge is not None:
            self.kv_gauge.observe(scheduler, now, step_s)
        self.schedule(now + step_s, _WORKER, worker)

    def _record(self, worker: GenWorker, plan: GenPlan) -> None:
        now = self.now
        for request_id in plan.finished_ids:
            request = self.requests[request_id]
            assert request.gen is not None
            if request.gen.finish_reason is FinishReason.ABORT:
                requeue_evicted(worker, request, now)
                continue
            request.first_gen_token = request.gen.first_gen_token_time
            if request.first_token_time is None:  # colocated: the worker's first token
                request.first_token_time = request.gen.first_token_time
            request.last_token = request.gen.last_token_time
            self._finish(request)
        for request_id in plan.admitted_ids:
            request = self.requests[request_id]
            if request.admitted is None:
                request.admitted = now
                assert request.gen is not None
                request.cached_tokens = request.gen.num_cached_tokens
        for request_id in plan.paused_ids:
            self.requests[request_id].num_pauses += 1
