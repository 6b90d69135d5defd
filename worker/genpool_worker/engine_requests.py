"""The engine's side of one request's life (docs/worker.md#engine-loop): into the queue
(or answered from a loaded first token, or refused), finished (its held blocks handed to
the KV connector), or failed alone. A mixin of ``GenEngine``, which owns the state
declared here; it runs on the engine thread only. No torch."""

from __future__ import annotations

import threading

from genpool_core.admission import QueueFullError
from genpool_core.block_hash import BlockHash, block_hashes
from genpool_core.request import FinishReason
from genpool_core.scheduler import GenScheduler
from genpool_worker.engine_io import Arrival, EngineObserver, EngineRequest, ModelRunner
from genpool_worker.events import Accepted, Failed, Rejected
from genpool_worker.kv_connector import KVConnector
from genpool_worker.output_processor import OutputProcessor
from genpool_worker.request_faults import describe


def ends_at_first_token(arrival: Arrival, eos_ids: tuple[int, ...]) -> bool:
    """A loaded request with nothing to decode: one token, or an EOS it may stop at."""
    first = arrival.kv_transfer.first_token
    if first is None:
        return False
    may_stop = first in eos_ids and arrival.min_tokens <= 1 and not arrival.ignore_eos
    return arrival.max_tokens <= 1 or may_stop


class RequestLifecycle:
    scheduler: GenScheduler
    runner: ModelRunner
    output: OutputProcessor
    kv_connector: KVConnector
    _unheld: list[str]  # held at finish, but nobody takes them: released next pass
    _lock: threading.Lock
    _requests: dict[str, EngineRequest]
    _failures: dict[str, str]  # failed alone in the engine, finished next pass
    _inflight: int
    _observer: EngineObserver | None

    def _admit_to_queue(self, request: EngineRequest, now: float) -> None:
        arrival = request.arrival
        if ends_at_first_token(arrival, self.runner.info.eos_token_ids):
            self._answer_from_first_token(request)
            return
        gen = arrival.gen_request(now, self._prompt_hashes(arrival))
        try:
            self.scheduler.add_request(gen, now)
        except (QueueFullError, ValueError) as exc:
            status = 429 if isinstance(exc, QueueFullError) else 400
            self._reject(request, status, str(exc))
            return
        try:
            self.runner.add_request(arrival)
        except Exception as exc:  # this request alone cannot run
            self.scheduler.abort(arrival.request_id)  # a waiter: it leaves at once
            self._reject(request, 500, f"request failed in the engine: {describe(exc)}")
            return
        self._requests[arrival.request_id] = request
        request.gen = gen
        self.kv_connector.on_queued(arrival)
        request.emit(Accepted())
        first = arrival.kv_transfer.first_token
        if first is not None:  # the client gets the first token at once
            try:
                self.output.on_token(request, first)
            except Exception as exc:
                self._fail_alone(arrival.request_id, describe(exc))

    def _prompt_hashes(self, arrival: Arrival) -> list[BlockHash]:
        """Its prompt's full blocks' hashes when the prefix cache may share them (a loaded
        request's prompt KV comes whole from elsewhere)."""
        if not self.scheduler.kv.is_caching or arrival.kv_transfer.is_loaded:
            return []
        return block_hashes(arrival.prompt_ids, self.runner.info.kv_block_size)

    def _reject(self, request: EngineRequest, status: int, message: str) -> None:
        self._requests.pop(request.request_id, None)
        with self._lock:
            self._inflight -= 1
        self.kv_connector.drop(request.arrival)
        request.emit(Rejected(status, message))

    def _answer_from_first_token(self, request: EngineRequest) -> None:
        """A loaded request whose first token ends it never queues (nothing to decode)."""
        first = request.arrival.kv_transfer.first_token
        assert first is not None
        self._requests.pop(request.request_id, None)
        with self._lock:
            self._inflight -= 1
        self.kv_connector.drop(request.arrival)
        request.emit(Accepted())
        try:
            self.output.on_token(request, first)
            is_stop = first in self.runner.info.eos_token_ids or request.is_stop_matched
            self.output.on_finished(request, FinishReason.STOP if is_stop else FinishReason.LENGTH)
        except Exception as exc:
            request.emit(Failed(f"request failed in the engine: {describe(exc)}", 500))

    def _fail_alone(self, request_id: str, message: str) -> None:
        """``request_id`` failed inside the engine: it leaves next pass (an abort to the
        scheduler, which frees its slot and blocks) with a 500; the rest go on."""
        if request_id in self._failures or request_id not in self._requests:
            return
        self._failures[request_id] = message
        self.scheduler.forget_kv(request_id)  # its KV may be wrong: nobody shares it
        self.scheduler.abort(request_id)

    def _finish(self, request_id: str, reason: FinishReason, *, is_held: bool = False) -> None:
        """``is_held``: the plan held its blocks (``GenPlan.held_ids``): the KV connector
        takes them before the reply goes out (which may name them), or they go back."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        self.runner.remove_request(request_id)
        with self._lock:
            self._inflight -= 1
        failure = self._failures.pop(request_id, None)
        if is_held and not self.kv_connector.on_held(
            request, self.scheduler.kv.held_blocks(request_id)
        ):
            self._unheld.append(request_id)
        self.kv_connector.drop(request.arrival)
        if self._observer is not None:
            self._observer.on_finished(request, reason)
        if failure is not None:
            request.emit(Failed(f"request failed in the engine: {failure}", 500))
            return
        try:
            self.output.on_finished(request, reason)
        except Exception as exc:  # its last text cannot be made: it alone fails
            request.emit(Failed(f"request failed in the engine: {describe(exc)}", 500))
