"""One GEN scheduling pass, ``step(now)`` (docs/design.md#scheduling-pass), and its plan.

observe completions -> resume due -> admit -> pause for at-risk waiters -> emit the
plan. The engine and the simulator both drive this class: ``add_request`` /
``abort`` between passes, ``step(now)`` to get a :class:`GenPlan`, run the batch,
then ``postprocess(plan, now, stop_ids)`` with the tokens it produced.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from genpool_core.admission import AdaptiveTarget, AdmissionQueue
from genpool_core.knobs import Knobs
from genpool_core.kv_account import KVAccount
from genpool_core.kv_blocks import KVBudget
from genpool_core.live import LiveConfig
from genpool_core.names import DEFAULT_STAT_INTERVAL_S
from genpool_core.plan import GenPlan
from genpool_core.preemption import (
    GenCapacity,
    GenPreemptionSettings,
    PauseLane,
    PreemptionMode,
    PreemptionPolicy,
    Victim,
    create_gen_preemption,
)
from genpool_core.prefill_budget import PrefillChunk, PrefillOrder, PrefillQueue
from genpool_core.request import FinishReason, GenRequest, RequestStatus, is_valid_time
from genpool_core.scheduler_phases import SchedulerPhases
from genpool_core.scheduler_views import UnknownRequestError as UnknownRequestError
from genpool_core.slots import SlotPool
from genpool_core.speculation import check_emitted, scheduled_drafts, store_drafts
from genpool_core.statline import StatLine
from genpool_core.statperiod import LoadCounters, StatCadence


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_queue_length: int = 1024
    stat_interval_s: float = float(DEFAULT_STAT_INTERVAL_S)
    guard_factor: float = 2.0
    target_quantile: float = 0.9
    kv_budget: KVBudget | None = None  # None: no KV memory limit, only B and H bound residents
    # Prompt tokens prefilled per pass (chunked prefill, genpool_core.prefill_budget);
    # None: each prompt whole in the pass that admits it.
    max_prefill_tokens_per_pass: int | None = None
    # Who gets that budget first: "risk" (least laxity; genpool_core.prefill_budget) or
    # "arrival" (oldest first).
    prefill_order: PrefillOrder = "risk"
    # Prefix caching (genpool_core.kv_account): admissions share the cached blocks their
    # prompt starts with. Needs a KV budget and requests that carry block hashes.
    enable_prefix_caching: bool = False
    # Check every KV block release against what is held (tests, debugging): a pass costs
    # more; off, the block pool trusts the scheduler's calls (genpool_core.kv_blocks).
    check_kv: bool = False
    # Keep KV events (BlockStored / BlockRemoved) for a publisher to take each pass; off,
    # nobody reads them, and eviction reads no hash.
    record_kv_events: bool = False
    # Speculative decoding (genpool_core.speculation): drafts a batch member may verify
    # per step; 0 is off.
    num_speculative_tokens: int = 0


class GenScheduler(SchedulerPhases):
    def __init__(self, policy: PreemptionPolicy, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        if not (math.isfinite(self.config.stat_interval_s) and self.config.stat_interval_s > 0):
            raise ValueError(f"stat_interval_s must be > 0, got {self.config.stat_interval_s}")
        if self.config.num_speculative_tokens < 0:
            raise ValueError(
                f"num_speculative_tokens must be >= 0, got {self.config.num_speculative_tokens}"
            )
        self.policy = policy
        self.pausing = PauseLane()
        cap = policy.capacity
        self._knobs = Knobs(cap.resident_headroom, cap.paused_cap)
        self._generation = 0  # of the live config in force (PUT /config tags it)
        self._is_preemption_on = policy.mode is not PreemptionMode.OFF
        self._per_pass_budget = policy.settings.per_pass_budget
        settings = policy.settings
        self.max_batch_size = cap.max_batch_size
        self.slots = SlotPool(cap.max_batch_size, cap.resident_headroom, cap.max_resident_headroom)
        self.kv = KVAccount(self.config.kv_budget, is_caching=self.config.enable_prefix_caching,
                            is_checked=self.config.check_kv,
                            is_recording=self.config.record_kv_events)  # fmt: skip
        target = AdaptiveTarget(
            settings.admission_target_min_s,
            settings.admission_target_max_s,
            self.config.target_quantile,
        )
        self.queue = AdmissionQueue(
            self.config.max_queue_length, target, settings.slack_s, self.config.guard_factor
        )
        self._active: dict[str, GenRequest] = {}
        self._batch_slots: dict[str, int] = {}
        self._residents: dict[str, GenRequest] = {}
        budget = self.config.max_prefill_tokens_per_pass
        self._prefill = None if budget is None else PrefillQueue(budget, self.config.prefill_order)
        self._pending_finish: dict[str, FinishReason] = {}
        self._released_held: list[str] = []  # since the last plan, which states them
        self._last_now: float | None = None
        self._last_plan: GenPlan | None = None
        self._pass_victims: Iterator[Victim] | None = None
        self._counts = LoadCounters()
        self._stat_cadence = StatCadence(self.config.stat_interval_s)

    @classmethod
    def from_settings(
        cls,
        settings: GenPreemptionSettings | dict[str, object],
        capacity: GenCapacity,
        config: SchedulerConfig | None = None,
    ) -> GenScheduler:
        return cls(create_gen_preemption(settings, capacity), config)

    # -- inputs between passes ---------------------------------------------------

    def add_request(self, request: GenRequest, now: float) -> None:
        """Queue a waiter; raises ``ValueError`` or ``QueueFullError`` leaving state as is."""
        self._check_time(now)
        request.validate()
        if request.arrival_time is not None and request.arrival_time > now:
            raise ValueError(f"arrival_time={request.arrival_time} is after now={now}")
        if request.request_id in self._residents:
            raise ValueError(f"request {request.request_id!r} is already resident")
        self.kv.check_fits_ever(request)
        self.queue.push(request)
        self._counts.arrivals += 1

    def abort(self, request_id: str) -> None:
        """A waiter leaves at once; a resident (paused ones too) is released next pass."""
        if request_id in self.queue:
            request = self.queue.remove(request_id)
            request.status = RequestStatus.FINISHED
            request.finish_reason = FinishReason.ABORT
            self._counts.aborted += 1
        elif request_id in self._residents:
            self._pending_finish.setdefault(request_id, FinishReason.ABORT)
        else:
            raise UnknownRequestError(request_id)

    def forget_kv(self, request_id: str) -> None:
        """A resident's KV may not be what its hashes say (it failed in the engine): what
        of it the prefix cache could share is forgotten. Unknown ids are ignored."""
        request = self._residents.get(request_id)
        if request is not None:
            self.kv.forget(request)

    def release_held(self, request_id: str) -> bool:
        """Free a finished request's held KV blocks (pulled, cancelled or expired; docs/pd.md)
        now, so the next pass may admit into them; its plan states it (``released_held_ids``).
        False when it holds none: a second release is harmless."""
        is_released = self.kv.release_held(request_id)
        if is_released:
            self._released_held.append(request_id)
        return is_released

    def postprocess(
        self,
        plan: GenPlan,
        now: float,
        stop_ids: tuple[str, ...] = (),
        num_emitted: Mapping[str, int] | None = None,
        num_drafted: Mapping[str, int] | None = None,
        drafts: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        """Each batch request produced its tokens at ``now``; ``stop_ids`` ended on a stop.

        ``num_emitted``: tokens per member when speculation made several (its accepted
        drafts and its own; genpool_core.speculation), 1 for a member it omits;
        ``num_drafted``: drafted tokens each member verified (the stat line's counts);
        ``drafts``: each member's drafts for its next step (genpool_core.speculation). A request
        admitted with ``num_output_tokens == 0`` (the worker does its own prefill) gets
        its first token from that prefill in its admission pass; the first token stamps
        ``first_token_time`` when no context server did.
        """
        if plan is not self._last_plan:
            raise ValueError("postprocess takes the latest plan, once")
        self._check_time(now)
        stops, emitted = set(stop_ids), num_emitted or {}
        self._check_outputs(plan, stops, emitted, drafts)
        if self.config.num_speculative_tokens > 0:
            members = {request_id: self._active[request_id] for request_id in plan.batch_ids}
            store_drafts(members, drafts or {}, self.config.num_speculative_tokens)
        self._last_plan = None
        self._advance_batch(plan, now, stops, emitted)
        if num_drafted:
            accepted = sum(emitted.get(r, 1) - 1 for r in num_drafted)
            self._counts.count_drafts(sum(num_drafted.values()), accepted)
        if plan.prefill_chunks and self._prefill is not None:
            self._prefill.observe_pass(now - plan.now)
        if plan.batch_ids:
            seconds, batch = now - plan.now, len(plan.batch_ids)
            self._counts.count_step(batch, seconds)
            # The policy's rate prior is per emitted token: a step that emitted more
            # than one token per member is that much shorter per token.
            tokens = batch + sum(emitted.values()) - len(emitted)
            self.policy.on_step_time(seconds * batch / tokens)

    def _check_outputs(
        self,
        plan: GenPlan,
        stops: set[str],
        emitted: Mapping[str, int],
        drafts: Mapping[str, Sequence[int]] | None,
    ) -> None:
        """What ``postprocess`` was told names this pass's batch, within its plan; raises
        ``ValueError`` before anything counts."""
        if stops and not stops.issubset(plan.batch_ids):
            unknown = sorted(stops.difference(plan.batch_ids))
            raise ValueError(f"stop ids not in this pass's batch: {unknown}")
        check_emitted(plan.batch_ids, plan.drafts, emitted)
        if drafts and self.config.num_speculative_tokens <= 0:
            raise ValueError("drafts given with speculative decoding off")

    def _advance_batch(
        self, plan: GenPlan, now: float, stops: set[str], emitted: Mapping[str, int]
    ) -> None:
        """Each member's tokens counted at ``now``; a stop, or its last permitted token,
        ends it at the next pass."""
        for request_id in plan.batch_ids:
            request = self._active[request_id]
            request.num_output_tokens += emitted.get(request_id, 1)
            request.last_token_time = now
            if request.first_gen_token_time is None:
                request.first_gen_token_time = now
                if request.arrival_time is not None:
                    self._counts.count_first_token(now - request.arrival_time)
            if request.first_token_time is None:  # this worker did the prefill
                request.first_token_time = now
            # EOS on the last permitted token is a stop (as OpenAI servers report it).
            if request_id in stops:
                self._pending_finish.setdefault(request_id, FinishReason.STOP)
            elif request.num_output_tokens >= request.max_tokens:
                self._pending_finish.setdefault(request_id, FinishReason.LENGTH)

    @property
    def knobs(self) -> Knobs:
        """The knobs as last set (a live decrease applies as residents finish)."""
        return self._knobs

    def live_config(self) -> LiveConfig:
        target = self.queue.target
        return LiveConfig(
            self._knobs, self.queue.slack_s, target.x_min, target.x_max, self._generation
        )

    def reconfigure(self, config: LiveConfig) -> None:
        """Apply a live change (operator, tuner); all of it is checked before any applies."""
        config.check(self.slots.max_resident_headroom(), self._is_preemption_on)
        self._generation = config.generation
        self._knobs = config.knobs
        self.slots.set_resident_headroom(config.knobs.resident_headroom)
        self.queue.target.set_bounds(config.admission_target_min_s, config.admission_target_max_s)
        self.queue.slack_s = config.slack_s

    def set_knobs(self, knobs: Knobs) -> None:
        """Apply new knobs (H and P together), checked as a pair."""
        self.reconfigure(replace(self.live_config(), knobs=knobs))

    # -- the pass ------------------------------------------------------------------

    def step(self, now: float) -> GenPlan:
        self._check_time(now)
        if self._last_plan is not None:
            raise ValueError("postprocess the previous plan before the next step")
        self._last_now = now
        self._pass_victims = None
        finished, held = self._observe(now)
        resumed = self._resume(now, due_only=True)
        swapped_out, swapped_in = self._swap_for_due(now)
        admitted = self._admit(now)
        paused, at_risk_admitted = self._pause_for_at_risk(now)
        resumed += swapped_in + self._resume(now, due_only=False)
        paused = swapped_out + paused
        admitted_ids = tuple(admitted + at_risk_admitted)
        chunks, prefill_ids = self._hand_out_prefill(admitted_ids, now)
        active = self._active
        paused_now = list(self.pausing)
        released, self._released_held = self._released_held, []
        drafts, output_lengths = scheduled_drafts(
            active.values(), prefill_ids, self.config.num_speculative_tokens
        )
        plan = GenPlan(
            now=now,
            batch_ids=tuple(active),  # keys are the request ids, in batch order
            batch_slots=tuple(self._batch_slots.values()),
            prefill_ids=prefill_ids,
            paused_in_place_ids=tuple([r.request_id for r in paused_now]),
            paused_in_place_slots=tuple([r.slot for r in paused_now if r.slot is not None]),
            admitted_ids=admitted_ids,
            admitted_blocks=tuple(self._residents[i].blocks for i in admitted_ids),
            admitted_cached_tokens=tuple(
                self._residents[i].num_cached_tokens for i in admitted_ids
            ),
            resumed_ids=tuple(resumed),
            paused_ids=tuple(paused),
            finished_ids=tuple(request_id for request_id, _ in finished),
            finish_reasons=tuple(reason for _, reason in finished),
            stat=self._maybe_stat_line(now),
            prefill_chunks=tuple(chunks),
            # Admitted with their first token made elsewhere: their prompt's KV is loaded.
            imported_ids=tuple(i for i in admitted_ids if self._residents[i].tokens_at_admission),
            held_ids=tuple(held),
            released_held_ids=tuple(released),
            drafts=drafts,
            output_lengths=output_lengths,
        )
        self._last_plan = plan
        return plan

    def _hand_out_prefill(
        self, admitted_ids: tuple[str, ...], now: float
    ) -> tuple[list[PrefillChunk], tuple[str, ...]]:
        """This pass's prefill chunks and the requests whose prefill completes in it."""
        if self._prefill is None:
            # postprocess gives every batch member a token, so a member without one
            # joined in this pass (admitted; admissions stay in the batch all pass).
            active = self._active
            return [], tuple(i for i in admitted_ids if active[i].num_output_tokens == 0)
        chunks, completed = self._prefill.hand_out(
            is_decoding=bool(self._active), slack_of=lambda r: self.queue.slack(r, now)
        )
        for request_id, _, end in chunks:
            self.kv.register_computed(self._residents[request_id], end)
        for request in completed:  # after every pause: a new member is no victim this pass
            self._enter_batch(request)
        return chunks, tuple(r.request_id for r in completed)

    def _observe(self, now: float) -> tuple[list[tuple[str, FinishReason]], list[str]]:
        """Release what finished since the last pass; (finished with reasons, held ids)."""
        finished = list(self._pending_finish.items())
        self._pending_finish.clear()
        held: list[str] = []
        for request_id, reason in finished:
            request = self._residents.pop(request_id)
            self.pausing.release(request, now)
            if request_id in self._active:
                self._leave_batch(request)
            elif self._prefill is not None and request_id in self._prefill:
                self._prefill.remove(request_id)  # aborted mid-prefill
            assert request.slot is not None
            self.slots.free(request.slot)
            if request.holds_kv_at_finish and reason is not FinishReason.ABORT:
                self.kv.hold(request)  # until release_held: another worker pulls its KV
                held.append(request_id)
            else:
                self.kv.release(request)
            request.status = RequestStatus.FINISHED
            request.finish_reason = reason
            if reason is FinishReason.ABORT:
                self._counts.aborted += 1
            else:
                self._counts.completed += 1
                is_below_target = self.policy.on_complete(request, now)
                if is_below_target is not None:
                    self.pausing.count_completion(is_below_target)
        return finished, held

    def _maybe_stat_line(self, now: float) -> StatLine | None:
        if not self._stat_cadence.is_due(now):
            return None
        line = self._stat_cadence.line(self.make_stats(now))
        self.policy.on_stat_period(now)
        return line

    def _check_time(self, now: float) -> None:
        if not is_valid_time(now):
            raise ValueError(f"now must be a finite time >= 0, got {now!r}")
        if self._last_now is not None and now < self._last_now:
            raise ValueError(f"now={now} is before the previous pass ({self._last_now})")
