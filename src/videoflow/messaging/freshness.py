"""Which of a REALTIME node's waiting inputs it works through, and which a newer one
supersedes.

A REALTIME stream that only one-parent nodes read keeps its newest messages,
REALTIME_BURST of them per subject (videoflow.core.credit.realtime_buffer_for: what the
flow's provisioning asks for), so a burst -- a parent catching up after a stall, a
processor's outputs of inputs it took at once -- reaches its readers whole, where a
stream that kept one had each message of a burst evict the one before it on the
broker. A stream a join reads keeps one, as before. What a reader does with a burst is
decided here, per receive: it works through as many of the newest inputs waiting as it
gets through within CATCH_UP_SECONDS, at its mean time per input, and supersedes the
older ones.

- A node that keeps up (a 1 kHz IMU's reader at half a millisecond an input) works
  through a whole burst: 16 inputs cost it 8 ms of lateness, and nothing is lost.
- A slow one (a detector at 100 ms a frame) takes the newest only: what it would work
  through is older than what it can already have, and it would stay that far behind.
- The newest may not be in hand: a receive of large messages is shallow (the adapter
  parks a few MB at most), so the inputs the broker says wait beyond it count as
  newer, and what it took is superseded whole when they are enough.

Its time per input is the time from one receive to the next over the inputs it worked
through in between: everything the node and its messenger spend on an input, not only
the node's process(). A node that has not worked through a receive yet keeps the newest
UNTIMED_KEPT: the inputs of a flow starting together, but not the backlog a late reader
finds on the stream, which may be older than its whole work on one.

So a message is superseded only when a newer one is actually waiting, and only for a
node that would not get to both within CATCH_UP_SECONDS. One-parent nodes only: a join
matches its parents' inputs to each other, and its own bounds (max_pending, the
timeout) decide what it lets go.
"""

from __future__ import annotations

from typing import Final

CATCH_UP_SECONDS: Final = 0.05
"""How far behind its newest waiting input a REALTIME reader may work: the inputs it
would not get to within this, at its mean time per input, are superseded."""

UNTIMED_KEPT: Final = 4
"""The most inputs of one receive a node works through before its time per input is
known; the rest, the oldest, are superseded."""

_WEIGHT: Final = 0.05
"""The weight of the newest receive's time per input in the moving mean: about the
last twenty receives weigh, so one stall (a collection, a busy host) does not make a
fast node supersede the burst that follows it."""


class Freshness:
    """A one-parent REALTIME node's time per input, and what it keeps of a receive's
    inputs.

    Attributes:
        superseded: inputs superseded so far by a newer one waiting.
        per_input: the moving mean of the node's seconds per input; None before it
            worked through a receive.
    """

    def __init__(self) -> None:
        self.per_input: float | None = None
        self.superseded = 0
        self._returned: float | None = None  # when the last receive returned
        self._worked = 0  # the inputs it kept, worked through since

    def stale(self, taken: int, beyond: int, called: float, returned: float) -> int:
        """How many of the inputs a receive took, oldest first, a newer one
        supersedes: those past the newest the node gets through within
        CATCH_UP_SECONDS (UNTIMED_KEPT before its time per input is known), counting
        the beyond ones first. Counted in superseded.

        Arguments:
            taken: the inputs the receive took.
            beyond: how many inputs are known to wait past them, newer (0: none, or
                not known).
            called / returned: when the receive was called and when it returned: the
                time since the last one returned is what the inputs kept then cost.
        """
        if self._worked and self._returned is not None:
            cycle = max(0.0, called - self._returned) / self._worked
            self.per_input = cycle if self.per_input is None else (
                (1 - _WEIGHT) * self.per_input + _WEIGHT * cycle)
        self._returned = returned
        if self.per_input is None:
            kept = UNTIMED_KEPT
        elif self.per_input <= 0:
            kept = taken + beyond
        else:
            kept = max(1, int(CATCH_UP_SECONDS / self.per_input))
        stale = min(taken, max(0, taken + beyond - kept))
        self._worked = taken - stale
        self.superseded += stale
        return stale


__all__ = ["CATCH_UP_SECONDS", "UNTIMED_KEPT", "Freshness"]
