"""A one-parent REALTIME node's choice between working through a burst and taking the
newest input (videoflow.messaging.freshness)."""

from __future__ import annotations

import pytest

from videoflow.messaging.freshness import CATCH_UP_SECONDS, UNTIMED_KEPT, Freshness


def receives(freshness: Freshness, *, taken: int, per_input: float, count: int,
             idle: float = 0.0, start: float = 0.0) -> float:
    """count receives, each taking `taken` inputs; the node spends per_input seconds on
    each it keeps, then waits idle seconds inside the next receive. Returns the time
    the next receive is called."""
    now = start
    for _ in range(count):
        called, returned = now, now + idle
        kept = taken - freshness.stale(taken, 0, called, returned)
        now = returned + kept * per_input
    return now


def test_a_node_that_has_worked_through_nothing_keeps_the_newest_few() -> None:
    freshness = Freshness()
    assert freshness.stale(3, 0, 0.0, 0.0) == 0  # a flow starting together
    fresh = Freshness()
    # A late reader: its parent's stream kept 16 before it started.
    assert fresh.stale(16, 0, 0.0, 0.0) == 16 - UNTIMED_KEPT
    assert fresh.superseded == 16 - UNTIMED_KEPT


def test_the_time_per_input_is_what_a_receive_s_inputs_cost_until_the_next() -> None:
    freshness = Freshness()
    receives(freshness, taken=1, per_input=0.0005, idle=0.0005, count=50)
    # The time blocked in a receive is not the node's: half a millisecond an input.
    assert freshness.per_input == pytest.approx(0.0005, rel=0.01)


def test_a_node_that_keeps_up_works_through_a_burst() -> None:
    freshness = Freshness()
    now = receives(freshness, taken=1, per_input=0.0005, idle=0.0005, count=50)
    # Its parent stalled and sent 16 at once: 8 ms of work, all of it done.
    assert freshness.stale(16, 0, now, now) == 0
    assert freshness.superseded == 0


def test_a_slow_node_takes_the_newest_and_counts_the_rest() -> None:
    freshness = Freshness()
    # 100 ms a frame on a 30 fps camera: three frames wait at each receive.
    now = receives(freshness, taken=3, per_input=0.1, count=20)
    assert freshness.per_input == pytest.approx(0.1, rel=0.01)
    assert freshness.stale(3, 0, now, now) == 2
    assert freshness.superseded >= 19 * 2


def test_a_node_works_through_the_newest_it_gets_to_within_the_catch_up_time() -> None:
    freshness = Freshness()
    per_input = CATCH_UP_SECONDS / 5  # five inputs fit in the catch-up time
    now = receives(freshness, taken=1, per_input=per_input, count=10)
    assert freshness.stale(8, 0, now, now) == 3
    now += 5 * per_input
    # Three more wait beyond a shallow receive of two: only the newest five are kept.
    assert freshness.stale(2, 3, now, now) == 0
    now += 2 * per_input
    assert freshness.stale(2, 6, now, now) == 2  # all it took is older than the five


def test_one_slow_receive_moves_the_mean_by_its_weight_only() -> None:
    freshness = Freshness()
    now = receives(freshness, taken=1, per_input=0.001, count=50)
    # A 40 ms pause (a collection, a host stall) on one input.
    now = receives(freshness, taken=1, per_input=0.04, count=1, start=now)
    assert freshness.stale(16, 0, now, now) == 0  # still a fast node: 16 fit in 50 ms
