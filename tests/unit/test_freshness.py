"""A one-parent REALTIME node's choice between working through a burst and taking the
newest input (videoflow.messaging.freshness)."""

from __future__ import annotations

import pytest

from videoflow.messaging.freshness import RATE_SECONDS, UNTIMED_KEPT, Freshness


def cycles(freshness: Freshness, *, waiting: int, work: float, idle: float = 0.0,
           seconds: float, start: float = 0.0) -> float:
    """A node's receives for seconds: each takes waiting inputs, and the node works
    on the one it keeps for work seconds, then waits idle seconds for the next
    receive's. Returns the time of the next receive."""
    now = start
    while now < start + seconds:
        stale = freshness.stale(waiting, 0, now)
        for _ in range(waiting - stale):
            now += work
            freshness.worked(work, now)
        now += idle
    return now


def test_a_node_that_has_finished_no_input_works_through_what_it_took() -> None:
    freshness = Freshness()
    assert freshness.load() is None
    assert freshness.stale(4, 0, 0.0) == 0
    assert freshness.superseded == 0


def test_a_late_reader_works_through_no_more_than_the_newest_few_of_a_backlog() -> None:
    freshness = Freshness()
    # Its parent's stream kept 16 before it started: only the newest UNTIMED_KEPT are
    # worked through, as they would be of a flow starting together.
    assert freshness.stale(16, 0, 0.0) == 16 - UNTIMED_KEPT
    assert freshness.superseded == 16 - UNTIMED_KEPT


def test_a_node_that_does_not_keep_up_supersedes_what_it_took_when_newer_ones_wait_beyond(
) -> None:
    freshness = Freshness()
    now = cycles(freshness, waiting=2, work=0.05, seconds=2.0)
    before = freshness.superseded
    # A shallow receive (large frames) took 1, and the broker says 3 more wait: the one
    # in hand is older than all of them.
    assert freshness.stale(1, 3, now) == 1
    # The next receive took the 3: no more wait beyond, so the newest is worked on.
    assert freshness.stale(3, 0, now) == 2
    assert freshness.superseded == before + 3


def test_a_node_that_keeps_up_works_through_a_burst() -> None:
    freshness = Freshness()
    # 1 kHz, 0.4 ms an input: the load is 0.4.
    now = cycles(freshness, waiting=1, work=0.0004, idle=0.0006, seconds=2.0)
    load = freshness.load()
    assert load is not None and load == pytest.approx(0.4, rel=0.1)
    # The parent stalled and sent 12 at once: all 12 are worked through.
    assert freshness.stale(12, 0, now) == 0
    assert freshness.superseded == 0


def test_a_node_that_does_not_keep_up_takes_the_newest_and_counts_the_rest() -> None:
    freshness = Freshness()
    # A 30 fps camera and 50 ms an input: the first receive's 2 frames are worked
    # through (no load known yet), and from then on only the newest of each receive.
    now = cycles(freshness, waiting=2, work=0.05, seconds=3.0)
    load = freshness.load()
    assert load is not None and load == pytest.approx(2.0, rel=0.1)
    assert freshness.superseded >= 25  # about one a receive, after the first
    assert freshness.stale(4, 0, now) == 3  # the newest only


def test_the_load_forgets_what_is_older_than_its_time_constant() -> None:
    freshness = Freshness()
    # Overloaded first (10 ms inputs, three arriving for each), then light (1 ms
    # inputs, 10 ms apart) for five time constants: only the light part still weighs.
    now = cycles(freshness, waiting=3, work=0.010, seconds=2.0)
    assert (freshness.load() or 0) > 2
    now = cycles(freshness, waiting=1, work=0.001, idle=0.009, seconds=5 * RATE_SECONDS,
                 start=now)
    load = freshness.load()
    assert load is not None and load < 0.2
    assert freshness.stale(6, 0, now) == 0


def test_time_spent_waiting_for_input_lowers_the_load() -> None:
    freshness = Freshness()
    # A slow node (80 ms an input) on a parent that sends every 100 ms keeps up.
    now = cycles(freshness, waiting=1, work=0.08, idle=0.02, seconds=3.0)
    load = freshness.load()
    assert load is not None and load == pytest.approx(0.8, rel=0.1)
    assert freshness.stale(2, 0, now) == 0
