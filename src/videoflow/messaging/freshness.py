"""Which of a REALTIME node's waiting inputs it works through, and which a newer one
supersedes.

A REALTIME stream keeps a parent's newest messages, REALTIME_BURST of them per subject
(videoflow.core.credit: what the flow's provisioning asks for), so a burst -- a parent
catching up after a stall, a processor's outputs of inputs it took at once -- reaches its
readers whole, where a stream that kept one had each message of a burst evict the one
before it on the broker. What a reader does with a burst is decided here, per receive:

- a node that keeps up with its input (over the last second or so, its mean time per
  input was shorter than the mean interval between inputs) works through every input
  waiting, oldest first: a burst it absorbs before the next one comes costs a few of
  its input intervals of lateness, and nothing is lost;
- a node that does not keep up takes only the newest input waiting and supersedes the
  others: what it would work through is older than what it can already have, and it
  would stay that far behind. The newest may not be in hand: a receive of large
  messages is shallow (the adapter parks a few MB at most), so what it took is
  superseded whole while the broker says more wait beyond it, and the next receive
  takes those.

A node that has not finished an input yet works through the newest UNTIMED_KEPT of what
it took: the inputs of a flow starting together, but not the backlog a late reader finds
on the stream, which may be older than its whole work on one.

So a message is superseded only when a newer one is actually waiting, and only for a
node that could not process both before the next arrives. One-parent nodes only: a
join matches its parents' inputs to each other, and its own bounds (max_pending, the
timeout) decide what it lets go.
"""

from __future__ import annotations

import math
from typing import Final

UNTIMED_KEPT: Final = 4
"""The most inputs of one receive a node works through before its load is known (it
finished no input yet); the rest, the oldest, are superseded."""

RATE_SECONDS: Final = 1.0
"""The time constant of a node's moving load: about its last second weighs."""


class Freshness:
    """A one-parent REALTIME node's load, and what it keeps of a receive's inputs.

    The load is the work its input asks of it: the rate inputs arrive at times its
    mean time per input, both over the last second or so (RATE_SECONDS, decayed
    averages). Below 1, it gets through its input as fast as it comes. A whole second
    weighs, not the last few inputs: a node at the edge of keeping up, on a loaded
    host, would otherwise flip at every slow one. (The share of its time it spends
    busy would not do: a node that never keeps up is busy all the time, short of 1 by
    its receives.)

    Attributes:
        superseded: inputs superseded so far by a newer one waiting.
    """

    def __init__(self) -> None:
        self._arrived = 0.0  # decayed count of inputs received
        self._worked = 0.0  # decayed count of inputs worked on
        self._busy = 0.0  # decayed seconds spent on them
        self._span = 0.0  # decayed seconds elapsed
        self._last: float | None = None
        self.superseded = 0

    def _decay(self, now: float) -> None:
        if self._last is None:
            self._last = now
            return
        elapsed = max(0.0, now - self._last)
        self._last = now
        decay = math.exp(-elapsed / RATE_SECONDS)
        self._arrived *= decay
        self._worked *= decay
        self._busy *= decay
        self._span = self._span * decay + elapsed

    def worked(self, seconds: float, now: float) -> None:
        """The node spent seconds on an input, ending at now."""
        self._decay(now)
        self._worked += 1
        self._busy += seconds

    def load(self) -> float | None:
        """The input's rate times the node's mean time per input; None before the
        node finished an input, or before any time passed with inputs arriving."""
        if not self._worked or not self._arrived or self._span <= 0:
            return None
        return (self._busy / self._worked) * (self._arrived / self._span)

    def stale(self, taken: int, beyond: int, now: float) -> int:
        """How many of the inputs a receive took, oldest first, a newer one
        supersedes, counted in superseded:

        - none while the node keeps up (its load is below 1);
        - all but the newest UNTIMED_KEPT while its load is not known;
        - else all of them when newer ones wait beyond them (on the broker, or parked
          past a shallow receive), and all but the newest when none does.

        Arguments:
            taken: the inputs the receive took, none worked through yet.
            beyond: how many inputs are known to wait past them (0: none, or not
                known).
            now: the time of that receive.
        """
        self._decay(now)
        self._arrived += taken
        load = self.load()
        if load is None:
            stale = max(0, taken - UNTIMED_KEPT)
        elif load < 1.0:
            stale = 0
        else:
            stale = taken if beyond > 0 else max(0, taken - 1)
        self.superseded += stale
        return stale

__all__ = ["RATE_SECONDS", "UNTIMED_KEPT", "Freshness"]
