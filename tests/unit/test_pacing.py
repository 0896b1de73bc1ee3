"""When a caller's handed-over work is coalesced and when it goes out at once
(videoflow.broker.loop.Pacing): a paced source's messages at once, a fast producer's
in batches, whatever its turns cost and however its window holds it up now and then.
The clock is the caller's: each test plays a caller's calls at given times."""

from __future__ import annotations

from collections.abc import Iterable

from videoflow.broker.loop import BURST_GAP_SECONDS, Pacing

MS = 1e-3


def play(pacing: Pacing, calls: Iterable[tuple[float, float]], start: float = 100.0
         ) -> list[bool]:
    """Each call: (how long the caller was away before it, how long its turn took).

    Returns:
        per call, whether it was found in a burst.
    """
    now, bursts = start, []
    pacing.left(now)
    for away, turn in calls:
        now += away
        bursts.append(pacing.back(now))
        now += turn
        pacing.left(now)
    return bursts


def test_a_source_paced_at_1_khz_has_every_output_sent_at_once() -> None:
    # Its next() sleeps ~1 ms; sometimes it wakes late and catches up with two at once.
    stretches = [0.9 * MS, 1.0 * MS, 1.3 * MS, 0.05 * MS, 0.95 * MS] * 40
    assert not any(play(Pacing(), ((s, 0.05 * MS) for s in stretches)))


def test_a_source_paced_at_2_khz_an_imu_has_every_output_sent_at_once() -> None:
    assert not any(play(Pacing(), [(0.5 * MS, 0.04 * MS)] * 200))


def test_a_fast_producer_is_in_a_burst_within_a_dozen_calls_and_stays_in_it() -> None:
    bursts = play(Pacing(), [(0.05 * MS, 0.01 * MS)] * 200)
    assert bursts.index(True) <= 12 and all(bursts[12:])


def test_a_fast_producer_whose_turns_are_slow_stays_in_a_burst() -> None:
    # A turn that sends at once and reads what came back takes a while; counted as the
    # caller's own time, it tipped a fast producer out of its burst for good.
    bursts = play(Pacing(), [(0.05 * MS, 1.0 * MS)] * 200)
    assert all(bursts[12:])


def test_a_fast_producer_held_up_by_its_window_now_and_then_stays_in_a_burst() -> None:
    calls = ([(0.05 * MS, 0.01 * MS)] * 15 + [(5.0 * MS, 0.01 * MS)]) * 10
    bursts = play(Pacing(), calls)
    assert all(bursts[16:])


def test_a_fast_producer_whose_outputs_wait_for_window_room_stays_in_a_burst() -> None:
    # Each fourth output waits 3 ms for room among the publications in flight: the
    # wait runs the loop, so the caller's own time is from the loop's rest on.
    pacing, now, bursts = Pacing(), 100.0, []
    pacing.left(now)
    for n in range(200):
        rested = 0.0
        if n % 4 == 3:
            now += 3 * MS
            rested = now  # the loop let go as the wait ended
        now += 0.05 * MS
        bursts.append(pacing.back(now, rested))
        now += 0.01 * MS
        pacing.left(now)
    assert all(bursts[16:])


def test_a_producer_that_slows_down_leaves_its_burst() -> None:
    pacing = Pacing()
    assert play(pacing, [(0.05 * MS, 0.01 * MS)] * 50)[-1]
    after = play(pacing, [(1.0 * MS, 0.01 * MS)] * 20, start=200.0)
    assert not any(after[12:])


def test_the_first_call_is_not_a_burst_nor_the_next_ones_of_a_caller_at_the_gap() -> None:
    pacing = Pacing()
    assert not pacing.back(5.0)  # a caller starts as one back from a pause
    assert not any(play(pacing, [(BURST_GAP_SECONDS, 0.0)] * 100, start=6.0))
