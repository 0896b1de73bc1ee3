"""Event-time alignment of a time join's parents: which of them the join stops taking
input from, so that none runs far ahead of the slowest (JoinPolicy.max_drift_ms).

A time join holds every member of a group until the group's last member arrives. A
parent whose event time runs ahead of the others (a recorded source beside a live
camera, a camera whose frames arrive seconds late) would have the join hold its whole
lead: in memory, in pending groups up to max_pending (the oldest then evicted, the very
ones the laggard is about to complete), and, through the shared-memory store, in the
writers' payload budget. So, as Flink's watermark alignment pauses sources that run
ahead, the join stops taking a parent's input:

- when its watermark (the greatest event time the join has seen from it) is more than
  the drift bound ahead of the slowest live parent's (drift). Event time is known only
  once an input is taken: an input a receive took past the bound is set aside,
  undecoded beyond its envelope (its payload unread), and joined once the bound
  passes it; its parent is held back meanwhile. A receive takes whole batches, and
  the join still never joins a parent's input past the bound;
- and, while the pending groups fill half of max_pending, when it is a sync parent
  ahead of the slowest at all (pending): then only the slowest parents' input is
  taken, which completes the oldest groups instead of seeding new ones (a collect
  parent seeds no group, and the oldest groups' windows need its samples).

A live parent is one that has not ended with nothing left, and has not been silent for
the join's timeout (no input arrived and none was waiting for the node: the backstop
that gives a stopped parent up gives it up here too). A live parent not heard from yet
is the slowest of all until it speaks: the others wait for it, on the broker, for at
most the timeout. The slowest parent is never held back, so the join always takes
something while any live parent has input. Held-back input waits on the broker (and in
the adapter's bounded prefetch queue), where the join's silence backstop still hears it
(Join._hear_backlogs): a parent held back is never taken for silent.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple

DRIFT: Final = "drift"
PENDING: Final = "pending"
"""Why a parent is held back: it ran more than the drift bound ahead of the slowest, or
it is ahead while the pending groups fill half of max_pending."""


class Deferred(NamedTuple):
    """An input a receive took past its parent's bound, set aside (Join.defer): its
    event time, subscription, delivery and decoded envelope (its payload not read)."""

    event_ts: float
    sub: Any
    delivery: Any
    decoded: dict[str, Any]


class Alignment:
    """Which parents of a time join are held back, and for how long they were.

    Arguments:
        parents: every parent of the join, sync and collect.
        sync: the sync parents (those whose input seeds groups).
        drift: the drift bound, seconds (JoinPolicy.drift_seconds).
        timeout: the silence backstop, seconds; None: a parent is never silent.
        max_pending: the join's max_pending.

    A parent never heard from is silent once timeout has passed since the first update
    (the join's first receive: a node that spent long in open() has not been waiting).

    Attributes:
        held: the parents held back now, each with why (DRIFT or PENDING).
        excluded: the parents whose input is not taken now: those held back, and those
            with input set aside.
        bounds: per parent, the event time past which its input waits: the drift bound
            over the slowest other live parent (inf for the slowest, or a parent
            alone). An input a receive took past it is set aside, not joined, until
            the bound moves past it (Join.defer).
    """

    def __init__(self, parents: Iterable[str], sync: Iterable[str], drift: float,
                 timeout: float | None, max_pending: int) -> None:
        self.parents = list(parents)
        self.sync = frozenset(sync)
        self.drift, self.timeout = drift, timeout
        self.crowded_at = max(1, max_pending // 2)
        self.max_pending = max_pending
        self.held: dict[str, str] = {}
        self.bounds: dict[str, float] = dict.fromkeys(self.parents, math.inf)
        self.excluded: frozenset[str] = frozenset()
        self._last_input: dict[str, float] = {}
        self._held_since: dict[str, float] = {}
        self._held_total = dict.fromkeys(self.parents, 0.0)

    def heard(self, parent: str, now: float) -> None:
        """parent's input arrived, or waits for the node (on the broker, or its producer
        waits for payload room): it is not silent as of now."""
        if now > self._last_input.get(parent, -math.inf):
            self._last_input[parent] = now

    def silent_for(self, parent: str, now: float) -> float:
        """Seconds since parent's input last arrived or was heard waiting."""
        return max(0.0, now - self._last_input.get(parent, now))

    def live(self, parent: str, now: float, gone: frozenset[str]) -> bool:
        """Whether parent counts as the join's slowest candidate: not gone (ended with
        nothing left) and not silent for the timeout."""
        if parent in gone:
            return False
        return self.timeout is None or self.silent_for(parent, now) < self.timeout

    def update(self, marks: Mapping[str, float | None], pending: int, now: float,
               gone: frozenset[str] = frozenset(),
               deferring: frozenset[str] = frozenset()) -> int:
        """Decide who is held back now (held) and each parent's bound (bounds), from
        the parents' watermarks.

        Arguments:
            marks: each parent's watermark, None before its first input.
            pending: the incomplete groups the join holds.
            now: the join's clock.
            gone: parents that ended and have nothing left for the node.
            deferring: parents with input the join took but set aside, past their
                bound (held back until it is all in).

        Returns:
            How many inputs the join may take next without passing max_pending by
            seeding groups: max_pending less the pending groups, at least 1.
        """
        if len(self._last_input) < len(self.parents):  # the first update: the start
            for parent in self.parents:
                self._last_input.setdefault(parent, now)
        live = sorted((_mark(marks, p), p) for p in self.parents if self.live(p, now, gone))
        held: dict[str, str] = {}
        crowded = pending >= self.crowded_at
        bounds: dict[str, float] = {}
        for parent in self.parents:
            # The slowest live parent other than itself: a parent alone, or the slowest
            # of all, is never held back by its own event time.
            others = [mark for mark, p in live[:2] if p != parent]
            bound = others[0] + self.drift if others else math.inf
            bounds[parent] = bound
            mark = marks.get(parent)
            if mark is None:
                continue
            if mark > bound:
                held[parent] = DRIFT
            elif crowded and parent in self.sync and live and mark > live[0][0]:
                held[parent] = PENDING
        self.bounds = bounds
        # Set aside input is joined first: nothing more is taken of its parent meanwhile
        # (held back only once past its bound: input set aside at the start, before
        # any bound was known, is due at the next update).
        self.excluded = frozenset(held) | deferring
        for parent in self._held_since.keys() - held.keys():
            self._held_total[parent] += now - self._held_since.pop(parent)
        for parent in held.keys() - self._held_since.keys():
            self._held_since[parent] = now
        self.held = held
        return max(1, self.max_pending - pending)

    def held_back_seconds(self, now: float) -> dict[str, float]:
        """Per parent, how long the join has held it back so far, the current hold
        included."""
        return {p: total + (now - self._held_since[p] if p in self._held_since else 0.0)
                for p, total in self._held_total.items()}


def _mark(marks: Mapping[str, float | None], parent: str) -> float:
    """A parent's watermark, -inf before its first input (the slowest of all)."""
    mark = marks.get(parent)
    return -math.inf if mark is None else mark


__all__ = ["DRIFT", "PENDING", "Alignment", "Deferred"]
