"""The phases of a pass that move requests between the queue, the batch and the pause
lane: resume, swap a due request for a victim, admit, pause for at-risk waiters.

A base class of :class:`~genpool_core.scheduler.GenScheduler`, so that ``scheduler.py``
holds the inputs and the pass's order (docs/design.md#scheduling-pass). The attributes
annotated here are set by ``GenScheduler``.
"""

from __future__ import annotations

from collections.abc import Iterator

from genpool_core.preemption import Victim
from genpool_core.request import GenRequest
from genpool_core.scheduler_views import SchedulerViews


class SchedulerPhases(SchedulerViews):
    _is_preemption_on: bool
    _per_pass_budget: int
    _pass_victims: Iterator[Victim] | None
    # The batch's slots, kept beside ``_active`` in the same order: the plan states them
    # every pass, and reading 256 request objects for them cost ~15 us a pass.
    _batch_slots: dict[str, int]

    def _resume(self, now: float, *, due_only: bool) -> list[str]:
        """Due resumes take free batch positions first; later, idle positions go early."""
        resumed: list[str] = []
        lane = self.pausing
        while self._num_positions() < self.max_batch_size and (
            lane.is_head_due(now) if due_only else len(lane) > 0
        ):
            request = lane.peek()
            assert request is not None
            lane.resume(request, now)
            self._enter_batch(request)
            resumed.append(request.request_id)
        return resumed

    def _victims(self, now: float) -> Iterator[Victim]:
        """This pass's ranked victims: one ranking serves both the swaps and the pauses.

        Valid for the whole pass: standings do not change at the same ``now``, each
        victim is yielded once, and requests that enter the batch during the pass are
        in hysteresis (never candidates). Lazy: a pass that takes no victim ranks nothing.
        """
        if self._pass_victims is None:
            self._pass_victims = self.policy.choose_victims(now)
        return self._pass_victims

    def _swap_for_due(self, now: float) -> tuple[list[str], list[str]]:
        """A due request still waiting for a position swaps with a fresh victim.

        Without this a pause would last until some request completes, not until its
        due time, and neither the TPOT budget nor the laxity margin would hold in a
        saturated batch. The paused count does not change; at most
        ``per_pass_budget`` swaps per pass; hysteresis and the pause limits stop
        ping-pong.
        """
        lane = self.pausing
        # Over a live-lowered cap, pausing stops: due requests wait for free positions.
        if not lane.is_head_due(now) or len(lane) > self._knobs.paused_cap:
            return [], []
        victims = self._victims(now)
        out: list[str] = []
        into: list[str] = []
        while len(out) < self._per_pass_budget and lane.is_head_due(now):
            victim = next(victims, None)
            if victim is None:
                break
            due = lane.peek()
            assert due is not None
            self._pause(victim, now)
            lane.resume(due, now)
            self._enter_batch(due)
            out.append(victim.request.request_id)
            into.append(due.request_id)
        return out, into

    def _admit(self, now: float) -> list[str]:
        """FIFO by the queue's order: a head whose blocks do not fit waits, and so does
        everyone behind it (no small request overtakes it and starves it)."""
        admitted: list[str] = []
        while (
            self._num_positions() < self.max_batch_size
            and self.slots.can_allocate()
            and self.kv.can_fit(self.queue.peek())
        ):
            admitted.append(self._admit_head(now))
        return admitted

    def _admit_head(self, now: float) -> str:
        is_after_warmup = self.queue.target.is_initialised
        request = self.queue.pop(now)
        request.slot = self.slots.allocate()
        self.kv.reserve(request)
        request.resident_since = now
        request.tokens_at_admission = request.num_output_tokens
        request.is_slo_counted = request.is_keyed and (is_after_warmup or request.has_own_slo)
        self.pausing.start_run(request, now)
        if self._prefill is not None and request.num_output_tokens == 0:
            self._prefill.add(request)  # joins the batch when its last chunk runs
        else:
            if request.num_output_tokens == 0:  # prefilled whole this pass, in plan order:
                self.kv.register_computed(request, request.prompt_len)  # later ones share it
            self._enter_batch(request)
        self._residents[request.request_id] = request
        return request.request_id

    def _pause_for_at_risk(self, now: float) -> tuple[list[str], list[str]]:
        if not self._is_preemption_on or not self.queue.is_head_at_risk(now):
            return [], []
        budget = min(
            self.queue.num_at_risk(now),
            self._per_pass_budget,
            self._knobs.paused_cap - len(self.pausing),
            self.slots.num_free,
        )
        paused: list[str] = []
        admitted: list[str] = []
        victims = self._victims(now)
        # A pause frees no KV block: it helps only a waiter whose blocks fit as it is.
        while (
            len(paused) < budget
            and self.queue.is_head_at_risk(now)
            and self._num_positions() >= self.max_batch_size
            and self.kv.can_fit(self.queue.peek())
        ):
            victim = next(victims, None)
            if victim is None:
                break
            self._pause(victim, now)
            paused.append(victim.request.request_id)
            admitted.append(self._admit_head(now))
        return paused, admitted

    def _pause(self, victim: Victim, now: float) -> None:
        self.pausing.pause(victim, now)
        self.policy.on_pause(victim)
        self._leave_batch(victim.request)

    def _enter_batch(self, request: GenRequest) -> None:
        """The one place a request joins the batch (at its end: batch order is entry order)."""
        self._active[request.request_id] = request
        if request.slot is not None:
            self._batch_slots[request.request_id] = request.slot
        self.policy.on_batch_enter(request)

    def _leave_batch(self, request: GenRequest) -> None:
        del self._active[request.request_id]
        self._batch_slots.pop(request.request_id, None)
        self.policy.on_batch_leave(request)
