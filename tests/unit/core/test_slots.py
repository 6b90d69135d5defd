import pytest

from genpool_core.preemption import GenCapacity
from genpool_core.scheduler import GenScheduler
from genpool_core.slots import SlotPool


def test_pool_sized_b_plus_headroom_with_dummy_after() -> None:
    pool = SlotPool(max_batch_size=8, resident_headroom=3, max_resident_headroom=3)
    assert pool.num_slots == 11
    assert pool.pool_size == 11
    assert pool.dummy_slot == 11
    slots = [pool.allocate() for _ in range(11)]
    assert slots == list(range(11))
    assert not pool.can_allocate()
    with pytest.raises(RuntimeError):
        pool.allocate()


def test_headroom_is_zero_when_preemption_off() -> None:
    scheduler = GenScheduler.from_settings({}, GenCapacity(16))
    assert scheduler.slots.resident_headroom() == 0
    assert scheduler.slots.num_slots == 16
    assert scheduler.slots.dummy_slot == 16


def test_default_headroom_is_the_paused_cap_when_on() -> None:
    scheduler = GenScheduler.from_settings({"target_output_tps": 10.0}, GenCapacity(16))
    assert scheduler.knobs.paused_cap == 6  # floor(0.375 * 16)
    assert scheduler.slots.resident_headroom() == 6
    assert scheduler.slots.dummy_slot == 22


def test_lowering_headroom_never_evicts_and_applies_as_slots_free() -> None:
    pool = SlotPool(max_batch_size=2, resident_headroom=2, max_resident_headroom=4)
    assert pool.dummy_slot == 6  # the ceiling is allocated once, the dummy after it
    held = [pool.allocate() for _ in range(4)]
    pool.set_resident_headroom(0)
    assert pool.num_used == 4 and not pool.can_allocate()
    pool.free(held[0])
    assert not pool.can_allocate()  # 3 used > B + 0
    pool.free(held[1])
    pool.free(held[2])
    assert pool.can_allocate() and pool.allocate() == 0
    pool.set_resident_headroom(4)
    assert pool.num_free == 4


def test_free_rejects_unallocated_and_headroom_above_ceiling() -> None:
    pool = SlotPool(2, 1, 1)
    with pytest.raises(ValueError, match="not allocated"):
        pool.free(0)
    with pytest.raises(ValueError, match="max_resident_headroom"):
        pool.set_resident_headroom(2)
    with pytest.raises(ValueError):
        SlotPool(0, 0, 0)
