import pytest

from genpool_core.admission import AdaptiveTarget, AdmissionQueue, QueueFullError, Tier
from tests.unit.support import keyed, unkeyed


def make_queue(x: float | None = 2.0, slack_s: float = 0.5, max_length: int = 8) -> AdmissionQueue:
    target = AdaptiveTarget(0.1, 30.0)
    target.value = x
    return AdmissionQueue(max_length, target, slack_s)


def test_pop_order_guard_then_slack_then_unkeyed() -> None:
    queue = make_queue(x=2.0)
    queue.push(unkeyed("u1"))
    queue.push(keyed("young", arrival=9.0))
    queue.push(keyed("old", arrival=4.0))  # age 6 > 2 * X at now=10: guard tier
    queue.push(unkeyed("u2"))
    queue.push(keyed("mid", arrival=8.5))
    now = 10.0
    assert queue.tier(queue.peek(), now) is Tier.GUARD  # type: ignore[arg-type]
    order = [queue.pop(now).request_id for _ in range(5)]
    assert order == ["old", "mid", "young", "u1", "u2"]


def test_late_head_triggers_and_guard_head_triggers() -> None:
    queue = make_queue(x=2.0, slack_s=0.5)
    queue.push(keyed("late", arrival=7.0))  # age 3 > X: slack -1
    assert queue.slack(queue.peek(), 10.0) == pytest.approx(-1.0)  # type: ignore[arg-type]
    assert queue.is_head_at_risk(10.0)
    guard = make_queue(x=2.0)
    guard.push(keyed("ancient", arrival=0.0))
    assert guard.tier(guard.peek(), 10.0) is Tier.GUARD  # type: ignore[arg-type]
    assert guard.is_head_at_risk(10.0)


def test_on_time_head_with_too_much_slack_never_triggers() -> None:
    queue = make_queue(x=2.0, slack_s=0.5)
    queue.push(keyed("fresh", arrival=9.0))  # slack 1.0 > 0.5
    assert not queue.is_head_at_risk(10.0)
    assert queue.num_at_risk(10.0) == 0
    assert queue.is_head_at_risk(10.5)  # slack 0.5 <= slack_s, at the boundary


def test_unkeyed_never_at_risk_and_nothing_before_warmup() -> None:
    queue = make_queue(x=0.1)
    queue.push(unkeyed("u"))
    assert not queue.is_head_at_risk(100.0) and queue.num_at_risk(100.0) == 0
    cold = make_queue(x=None)
    cold.push(keyed("k", arrival=0.0))
    assert cold.slack(cold.peek(), 100.0) is None  # type: ignore[arg-type]
    assert not cold.is_head_at_risk(100.0)


def test_num_at_risk_counts_keyed_with_small_slack() -> None:
    queue = make_queue(x=2.0, slack_s=0.5)
    for i, arrival in enumerate([1.0, 7.0, 7.5, 7.6, 9.9]):
        queue.push(keyed(f"r{i}", arrival))
    queue.push(unkeyed("u"))
    # at now=10, at risk means arrival <= 10 - 2 + 0.5 = 8.5
    assert queue.num_at_risk(10.0) == 4


def test_bounded_queue_rejects_without_losing_anyone() -> None:
    queue = make_queue(max_length=2)
    queue.push(keyed("a", 1.0))
    queue.push(unkeyed("b"))
    with pytest.raises(QueueFullError):
        queue.push(keyed("c", 0.5))
    assert len(queue) == 2 and "a" in queue and "b" in queue and "c" not in queue
    queue.pop(2.0)
    with pytest.raises(ValueError, match="already waiting"):
        queue.push(unkeyed("b"))


def test_remove_keeps_order_of_the_rest() -> None:
    queue = make_queue()
    for rid, arrival in [("a", 1.0), ("b", 1.0), ("c", 2.0)]:
        queue.push(keyed(rid, arrival))
    queue.push(unkeyed("u"))
    assert queue.remove("b").request_id == "b"
    assert queue.remove("u").request_id == "u"
    assert [queue.pop(5.0).request_id for _ in range(2)] == ["a", "c"]
    with pytest.raises(KeyError):
        queue.remove("zzz")


def test_adaptive_target_warms_up_then_tracks_the_quantile() -> None:
    target = AdaptiveTarget(0.01, 100.0, quantile=0.9)
    for i in range(AdaptiveTarget.WARMUP_ADMISSIONS - 1):
        target.observe(float(i + 1))
        assert target.value is None
    target.observe(32.0)
    assert target.value == 29.0  # sorted waits 1..32, index int(0.9 * 32) = 28
    # Waits uniform on [0, 1): the 0.9-quantile is 0.9.
    waits = [((i * 7919) % 1000) / 1000 for i in range(20000)]
    for wait in waits:
        target.observe(wait)
    assert target.value == pytest.approx(0.9, abs=0.06)


def test_adaptive_target_clamped_to_bounds() -> None:
    target = AdaptiveTarget(0.5, 2.0)
    target.value = 1.0
    for _ in range(500):
        target.observe(50.0)
    assert target.value == 2.0
    for _ in range(5000):
        target.observe(0.0)
    assert target.value == 0.5
    with pytest.raises(ValueError):
        AdaptiveTarget(2.0, 1.0)
    with pytest.raises(ValueError):
        AdaptiveTarget(0.0, 1.0)
    with pytest.raises(ValueError):
        AdaptiveTarget(0.1, 1.0, quantile=1.0)
