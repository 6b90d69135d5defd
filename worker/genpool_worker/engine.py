"""The GEN engine loop: schedule (the pass) -> run the model on the batch -> postprocess.

One thread owns the scheduler and the model; HTTP handlers talk to it only through
``submit`` / ``abort`` / ``reconfigure`` (thread-safe inboxes) and read the snapshot it
publishes after every pass. Tokens stream back through each request's asyncio queue.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from genpool_core.admission import QueueFullError
from genpool_core.plan import GenPlan
from genpool_core.request import GenRequest
from genpool_core.scheduler import GenScheduler
from genpool_core.statline import format_statline, make_statline
from genpool_worker.engine_io import (
    Arrival,
    Coordinator,
    DecodeModel,
    EngineRequest,
    EngineSnapshot,
    LocalCoordinator,
    PassInputs,
    Tokenizer,
)

STAT_LOGGER = logging.getLogger("genpool.gen_preemption")
log = logging.getLogger("genpool.worker")
IDLE_PASS_S = 0.25  # an idle worker still passes, so its stat line keeps coming


class GenEngine:
    def __init__(
        self,
        model: DecodeModel,
        tokenizer: Tokenizer,
        scheduler: GenScheduler,
        *,
        clock: Callable[[], float] = time.time,
        on_step: Callable[[float, int], None] | None = None,
        coordinator: Coordinator | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.coordinator: Coordinator = coordinator or LocalCoordinator()
        self._clock = clock
        self._on_step = on_step
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._inbox: list[EngineRequest] = []
        self._aborts: list[str] = []
        self._configs: list[tuple[dict[str, Any], Future[dict[str, Any]]]] = []
        self._config_futures: list[Future[dict[str, Any]]] = []
        self._requests: dict[str, EngineRequest] = {}
        self._pending: tuple[GenPlan, dict[str, int]] | None = None
        self._prev_end: float | None = None
        self._last_now = 0.0
        self._inflight = 0
        self._tokens_total = 0
        self._passes = 0
        self._last_line: str | None = None
        # Tests of rank identity record every plan's digest and every output.
        self.record_history = False
        self.plan_digests: list[str] = []
        self.completed: dict[str, list[int]] = {}
        self.generation = 0
        self.is_draining = False
        self.error: BaseException | None = None
        self._running = False
        self._thread = threading.Thread(target=self.run, name="genpool-engine", daemon=True)
        self.snapshot = self._make_snapshot(self._now())

    # -- API for other threads ------------------------------------------------------

    def start(self) -> None:
        """Run the loop in a background thread (rank 0, next to the HTTP server)."""
        self._running = True
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._running = False
        self._wake.set()
        self._thread.join(timeout)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    @property
    def inflight(self) -> int:
        return self._inflight

    def submit(self, request: EngineRequest) -> None:
        with self._lock:
            self._inbox.append(request)
            self._inflight += 1
        self._wake.set()

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborts.append(request_id)
        self._wake.set()

    def reconfigure(self, update: dict[str, Any]) -> Future[dict[str, Any]]:
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
                self._pass(inputs)
        except BaseException as exc:  # the worker must report, not hang: /health goes red
            self.error = exc
            log.exception("engine loop died")
            with self._lock:
                pending = list(self._requests.values()) + self._inbox
            for request in pending:
                request.emit("error", 500, f"engine failure: {exc}")
            if self.coordinator.rank != 0:
                raise

    def _collect(self) -> PassInputs:
        """Rank 0: this pass's inputs from the clock and the inboxes."""
        if not (self.scheduler.num_residents or self.scheduler.num_waiting or self._inbox):
            self._wake.wait(IDLE_PASS_S)
            self._wake.clear()
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
            arrivals=[request.arrival() for request in inbox],
            aborts=aborts,
            configs=[update for update, _ in configs],
            stop=not self._running,
        )

    def _apply(self, inputs: PassInputs) -> None:
        for arrival in inputs.arrivals:
            request = self._requests.get(arrival.request_id) or arrival.to_request()
            self._admit_to_queue(request, inputs.now)
        for request_id in inputs.aborts:
            if request_id in self._requests:
                self.scheduler.abort(request_id)
        futures = self._config_futures or [Future() for _ in inputs.configs]
        self._config_futures = []
        for update, future in zip(inputs.configs, futures, strict=True):
            try:
                self.scheduler.reconfigure(self.scheduler.live_config().updated(update))
                future.set_result(self.config())
            except (ValueError, TypeError) as exc:
                future.set_exception(exc)

    def _admit_to_queue(self, request: EngineRequest, now: float) -> None:
        gen = GenRequest(
            request_id=request.request_id,
            prompt_len=len(request.prompt_ids),
            max_tokens=request.max_tokens,
            arrival_time=None if request.arrival_time is None else min(request.arrival_time, now),
            first_token_time=request.first_token_time,
            num_output_tokens=0,
        )
        try:
            self.scheduler.add_request(gen, now)
        except (QueueFullError, ValueError) as exc:
            self._requests.pop(request.request_id, None)
            with self._lock:
                self._inflight -= 1
            request.emit("rejected", 429 if isinstance(exc, QueueFullError) else 400, str(exc))
            return
        if request.temperature > 0.0:
            # A stable seed (not hash()): every rank must draw the same tokens.
            seed = (
                request.seed
                if request.seed is not None
                else zlib.crc32(request.request_id.encode())
            )
            request.generator = torch.Generator().manual_seed(seed)
        self._requests[request.request_id] = request
        request.emit("accepted")

    def _pass(self, inputs: PassInputs) -> None:
        if self._pending is not None:
            previous, tokens = self._pending
            self._pending = None
            assert inputs.prev_end is not None
            self.scheduler.postprocess(previous, inputs.prev_end, self._stops(tokens))
        self._apply(inputs)
        plan = self.scheduler.step(inputs.now)
        if self.record_history:
            self.plan_digests.append(plan.digest())
        for request_id in plan.finished_ids:
            self._finish(request_id)
        if plan.stat_line is not None:
            self._last_line = plan.stat_line
            if self.coordinator.rank == 0:
                STAT_LOGGER.info(plan.stat_line)
        started = time.perf_counter()
        tokens = self._run_model(plan) if plan.batch_ids else {}
        self._prev_end = self._now()
        if tokens:
            self._pending = (plan, tokens)
        else:
            self.scheduler.postprocess(plan, inputs.now)
        for request_id, token in tokens.items():
            self._stream(self._requests[request_id], token)
        self._tokens_total += len(tokens)
        self._passes += 1
        if plan.batch_ids and self._on_step is not None:
            self._on_step(time.perf_counter() - started, len(plan.batch_ids))
        self.snapshot = self._make_snapshot(inputs.now)

    def _stops(self, tokens: dict[str, int]) -> tuple[str, ...]:
        eos = self.model.eos_token_id
        return tuple(request_id for request_id, token in tokens.items() if token == eos)

    def _run_model(self, plan: GenPlan) -> dict[str, int]:
        """Prefill the newly admitted (their token this pass), decode the rest."""
        logits: dict[str, torch.Tensor] = {}
        slots, last, positions, ids = [], [], [], []
        for request_id, slot in zip(plan.batch_ids, plan.batch_slots, strict=True):
            request = self._requests[request_id]
            if not request.output_ids:
                logits[request_id] = self.model.prefill(slot, request.prompt_ids)
                continue
            ids.append(request_id)
            slots.append(slot)
            last.append(request.output_ids[-1])
            positions.append(len(request.prompt_ids) + len(request.output_ids) - 1)
        if ids:
            batch_logits = self.model.decode(slots, last, positions)
            logits.update(zip(ids, batch_logits, strict=True))
        return {rid: self._sample(self._requests[rid], row) for rid, row in logits.items()}

    @staticmethod
    def _sample(request: EngineRequest, logits: torch.Tensor) -> int:
        if request.temperature <= 0.0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits.float() / request.temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=request.generator))

    def _stream(self, request: EngineRequest, token: int) -> None:
        request.output_ids.append(token)
        ids = request.output_ids
        if ids[-1] == self.model.eos_token_id:
            ids = ids[:-1]
        text = self.tokenizer.decode(ids)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the rest
            return
        if len(text) > request.text_sent:
            request.emit("token", text[request.text_sent :])
            request.text_sent = len(text)

    def _finish(self, request_id: str) -> None:
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        if self.record_history:
            self.completed[request_id] = list(request.output_ids)
        with self._lock:
            self._inflight -= 1
        eos = self.model.eos_token_id
        reason = "stop" if request.output_ids and request.output_ids[-1] == eos else "length"
        if len(request.output_ids) < request.max_tokens and reason != "stop":
            reason = "abort"
        text = self.tokenizer.decode([t for t in request.output_ids if t != eos])
        if len(text) > request.text_sent:
            request.emit("token", text[request.text_sent :])
        request.emit(
            "done",
            reason,
            {
                "prompt_tokens": len(request.prompt_ids),
                "completion_tokens": len(request.output_ids),
                "total_tokens": len(request.prompt_ids) + len(request.output_ids),
            },
        )

    # -- views ------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        scheduler = self.scheduler
        headroom, cap = scheduler.capacity_in_force()
        target = scheduler.queue.target
        return {
            "generation": self.generation,
            "mode": scheduler.policy.mode.value,
            "resident_headroom": scheduler.slots.resident_headroom(),
            "max_resident_headroom": scheduler.slots.max_resident_headroom(),
            "paused_cap": scheduler.knobs.paused_cap,
            "slack_s": scheduler.queue.slack_s,
            "admission_target_min_s": target.x_min,
            "admission_target_max_s": target.x_max,
            "in_force": {"resident_headroom": headroom, "paused_cap": cap},
        }

    def _make_snapshot(self, now: float) -> EngineSnapshot:
        stats = self.scheduler.make_stats(now)
        line = self._last_line or format_statline(make_statline(stats, None))
        return EngineSnapshot(
            stats, line, self.config(), self._inflight, self._tokens_total, self._passes
        )


__all__ = [
    "Arrival",
    "Coordinator",
    "DecodeModel",
    "EngineRequest",
    "EngineSnapshot",
    "GenEngine",
    "LocalCoordinator",
    "PassInputs",
    "Tokenizer",
]
