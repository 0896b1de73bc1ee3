"""ClockLearning: what a time join with clock_correction='running' holds while it learns
its parents' clocks, before its first group goes out.

A running correction moves a bounded step at a time (RunningCorrection), and each step
needs samples taken under it. Run live, a camera 20 ms off would miss every group until
the correction caught up -- seconds of quorum groups without it. Instead the join holds
its first groups and what it gives up on (nothing is acknowledged or counted as
dropped), measures them, and when the estimate calls for a step, takes the step, takes
everything it holds out of its assembler and groups it again under the new corrections
(Join.regroup): the next step is measured on the same inputs at once. Each step is
still bounded and logged. Once no parent's estimate calls for a step -- every sync
parent estimated and within its deadband, or at its limit -- the groups formed under
the final corrections go out in order, and what they left is settled as the join's
rules say: as if the corrections had been there from the first input.

Learning is bounded: it ends, whatever the estimates, LEARN_SECONDS after its input
caught up (its first input, or the last receive that came back full: a backlog being
caught up on says nothing of clocks until it is), once the held groups reach half the
policy's max_pending, or once every parent's input ended. What is held then goes out
as it stands, and the correction goes on running as usual.
"""

from __future__ import annotations

from typing import Final

from videoflow.messaging.grouping import ReadyGroup
from videoflow.messaging.messenger_deliveries import Held

LEARN_SECONDS: Final = 4.0
"""The longest a join learns once its input caught up (monotonic seconds). A join
learns only until every parent's estimate is in, 0.35-0.4 s on the demo; the bound
is for a loaded host, where a parent is judged live (ClockEstimator) later: beside
six CPU burners on two cores, the demo's fusion catching up on a 2 s backlog needed
2.4-3.2 s, and at a 2 s bound 3 of 6 runs gave up before cam2's clock was known
(every group then without it), against 1 of 8 at 4 s (its inputs ended first)."""


class ClockLearning:
    """A learning join's holdings (see the module).

    Arguments:
        max_groups: the most groups held (formed, and pending in the assembler) before
            learning ends.

    Attributes:
        groups: the groups formed since the last regrouping, in order.
        discards: what the join gave up on since then, with the reason.
        first: when the first input was added (monotonic), None before.
        started: that, or when the last full receive came back after it: what the
            time bound counts from.
        steps: the corrections' moves made while learning.
    """

    def __init__(self, max_groups: int) -> None:
        self.max_groups = max_groups
        self.groups: list[ReadyGroup] = []
        self.discards: list[tuple[Held, str]] = []
        self.first: float | None = None
        self.started: float | None = None
        self.steps = 0

    def bound_reached(self, now: float, pending: int) -> str | None:
        """Why learning must end now (a time bound or the held groups), or None."""
        if self.started is not None and now - self.started >= LEARN_SECONDS:
            return f"{LEARN_SECONDS:g} s had passed"
        if len(self.groups) + pending >= self.max_groups:
            return f"it held {self.max_groups} groups"
        return None


__all__ = ["LEARN_SECONDS", "ClockLearning"]
