"""A tap following the runs on a store (ops.tap with a broker function): it waits
through a run's broker that goes before it could attach, and hz's windows keep their
pace through a slow wait, never made up in a burst."""

from __future__ import annotations

import time

from videoflow.ops.tap import tap

DEAD_URL = "nats://127.0.0.1:1"  # nothing listens on port 1


def test_a_runs_broker_gone_before_the_tap_attached_is_waited_past() -> None:
    # The store says a run's broker answers, but it is gone by the connect: the tap
    # goes back to waiting for the next run instead of failing.
    asked: list[float] = []
    said: list[str] = []

    def broker() -> str | None:
        asked.append(time.monotonic())
        return DEAD_URL if len(asked) == 1 else None

    seen = tap(broker, "f", "n", lambda m: None, seconds=1.0, timeout=1.0,
               status=said.append)
    assert seen == 0
    assert len(asked) >= 2  # it looked again
    assert said == [f"waiting for a run on {broker}"]


def test_windows_keep_their_pace_after_a_slow_wait_not_a_burst() -> None:
    ticks: list[float] = []

    def slow_broker() -> str | None:
        time.sleep(0.35)  # a slow look at the store: longer than a window
        return None

    tap(slow_broker, "f", "n", lambda m: None, seconds=1.6, every=0.1,
        tick=lambda away: ticks.append(time.monotonic()))
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    # Windows missed during a wait are skipped, never ticked back to back.
    assert ticks and all(gap >= 0.09 for gap in gaps), gaps
