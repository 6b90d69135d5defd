"""The read-only side of :class:`~genpool_core.scheduler.GenScheduler`: sizes, lookups,
the capacity in force and the ``make_stats`` snapshot.

A base class, so that ``scheduler.py`` is the pass alone. It only reads state:
the attributes annotated on :class:`SchedulerViews` are set by ``GenScheduler``.
"""

from __future__ import annotations

from genpool_core.admission import AdmissionQueue
from genpool_core.knobs import Knobs
from genpool_core.kv_account import KVAccount
from genpool_core.names import PreemptionMode
from genpool_core.preemption import PauseLane, PreemptionPolicy
from genpool_core.prefill_budget import PrefillQueue
from genpool_core.request import GenRequest
from genpool_core.slots import SlotPool
from genpool_core.statperiod import LoadCounters
from genpool_core.stats import SchedulerStats


class UnknownRequestError(KeyError):
    """No waiting or resident request has this id."""


class SchedulerViews:
    policy: PreemptionPolicy
    pausing: PauseLane
    queue: AdmissionQueue
    slots: SlotPool
    kv: KVAccount
    max_batch_size: int
    _knobs: Knobs
    _active: dict[str, GenRequest]
    _residents: dict[str, GenRequest]
    _counts: LoadCounters
    _prefill: PrefillQueue | None

    @property
    def num_active(self) -> int:
        return len(self._active)

    def _num_positions(self) -> int:
        """Batch positions taken: members, and requests mid-prefill (each keeps one for
        the pass its prefill completes in)."""
        return len(self._active) + len(self.prefilling_ids())

    def prefilling_ids(self) -> tuple[str, ...]:
        """Residents mid-prefill (chunked prefill), oldest first: not batch members."""
        return () if self._prefill is None else self._prefill.ids()

    @property
    def num_paused(self) -> int:
        return len(self.pausing)

    @property
    def num_residents(self) -> int:
        return len(self._residents)

    @property
    def num_waiting(self) -> int:
        return len(self.queue)

    def active_ids(self) -> tuple[str, ...]:
        """Batch members in batch order (admission or resume order, newest last)."""
        return tuple(self._active)

    def get_request(self, request_id: str) -> GenRequest:
        request = self._residents.get(request_id)
        if request is None:
            raise UnknownRequestError(request_id)
        return request

    def capacity_in_force(self) -> tuple[int, int]:
        """(H, P) in force: a live decrease applies as residents finish, never evicting."""
        paused = self.num_paused
        headroom = max(self.slots.resident_headroom(), self.num_residents - self.max_batch_size)
        return max(headroom, paused), max(self._knobs.paused_cap, paused)

    def pause_budget(self, now: float) -> int | None:
        """How many at-risk waiters pausing could admit now: free paused slots (the cap,
        the resident slots) and residents the policy would pause; ``None`` with
        preemption off. What the replica scaler reads as "pausing can still absorb"."""
        if self.policy.mode is PreemptionMode.OFF:
            return None
        limit = min(self._knobs.paused_cap - self.num_paused, self.slots.num_free)
        if limit <= 0:
            return 0
        return self.policy.num_pausable(now, limit)

    def make_stats(self, now: float) -> SchedulerStats:
        counters = self.pausing.counters
        counts = self._counts
        return SchedulerStats(
            t=now,
            mode=self.policy.mode.value,
            target_output_tps=self.policy.settings.target_output_tps,
            residents=self.num_residents,
            active=self.num_active,
            paused=self.num_paused,
            paused_cap=self._knobs.paused_cap,
            resident_headroom=self.slots.resident_headroom(),
            waiters=self.num_waiting,
            at_risk=self.queue.num_at_risk(now),
            admission_target_s=self.queue.target.value,
            completed=counts.completed,
            aborted=counts.aborted,
            pauses=counters.pauses,
            victims=dict(counters.victims),
            laxity_sum=counters.laxity_sum,
            laxity_resumes=counters.laxity_resumes,
            forced_resumes=counters.forced_resumes,
            slo_completed=counters.slo_completed,
            below_target=counters.below_target,
            arrivals=counts.arrivals,
            steps=counts.steps,
            batch_sum=counts.batch_sum,
            drafted=counts.drafted,
            accepted=counts.accepted,
            batch_seconds=counts.batch_seconds,
            pause_budget=self.pause_budget(now),
            ttft_counts=tuple(counts.ttft_counts),
            mode_stats=self.policy.mode_stats(now, self.pausing),
            kv_blocks=self.kv.num_blocks,
            kv_blocks_used=self.kv.num_used,
            kv_blocks_paused=sum(len(r.blocks) for r in self.pausing),
            kv_blocks_cached=self.kv.num_cached,
            prefix_cache_queries=self.kv.num_queried_tokens,
            prefix_cache_hits=self.kv.num_hit_tokens,
        )
