"""The clocks the messaging layer and the task read, in the one place a simulation
(videoflow.testing.simulate) sets them.

``monotonic`` times leases, deadlines, settlement lingers and end-of-stream quiescence;
``wall`` is epoch seconds (a run's start and end, dead letters). Both are the time
module's until ``simulated`` swaps them for a simulated clock. Modules read them at
each call (``clock.monotonic()``), never bind them at import, so the swap reaches
them all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

monotonic: Callable[[], float] = time.monotonic
"""Monotonic seconds."""

wall: Callable[[], float] = time.time
"""Epoch seconds."""

_swapped = threading.Lock()


@contextmanager
def simulated(monotonic_now: Callable[[], float],
              wall_now: Callable[[], float]) -> Iterator[None]:
    """Within the block, every reader of this module's clocks reads these instead.

    The clocks are the process's: one simulation at a time.

    Raises:
        RuntimeError: a simulation is already running in this process.
    """
    global monotonic, wall
    if not _swapped.acquire(blocking=False):
        raise RuntimeError("a simulation is already running in this process: "
                           "the clocks are the process's, one simulation at a time")
    try:
        monotonic, wall = monotonic_now, wall_now
        yield
    finally:
        monotonic, wall = time.monotonic, time.time
        _swapped.release()
