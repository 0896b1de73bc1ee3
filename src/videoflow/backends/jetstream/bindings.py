"""The bound subscriptions of a JetStream backend: each binding (Binding: its spec,
read-back, receiver and advisory subscription), and the registry of them (Bindings)
with what outlives a rebind: the generation each subscription was bound at, its
admission filter, the exhausted marks (MSG-012) and the budget waits of retired
receivers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from videoflow.backends.jetstream.specs import ExhaustedMarks
from videoflow.backends.jetstream.subscription_receiver import SubscriptionReceiver
from videoflow.backends.messaging import (
    Delivery,
    SubscriptionId,
    SubscriptionSpec,
    VerifiedSubscription,
)


class Binding:
    """One bound subscription: its spec, read-back, operation id, stream, receiver and
    MAX_DELIVERIES advisory subscription."""

    def __init__(self, spec: SubscriptionSpec, verified: VerifiedSubscription,
                 operation_id: str, stream: str, receiver: SubscriptionReceiver) -> None:
        self.spec, self.verified, self.operation_id = spec, verified, operation_id
        self.stream, self.receiver = stream, receiver
        self.advisory: Any = None


Admission = tuple[Callable[[Delivery], bool], Callable[[Delivery], None] | None]
"""A subscription's admission filter and what is called with each delivery it skips."""


class Bindings:
    """The subscriptions bound here, and what each keeps across its rebinds.

    Attributes:
        bound: the current binding of each subscription (read from the caller's thread
            and the loop's: iterate over a copy).
        generations: the generation each subscription was last bound at (MSG-011).
        admission: each subscription's admission filter, set before or after a bind.
        exhausted: the messages counted as unresolved (MSG-012).
        retired_budget_waits: the byte-budget pauses of receivers a rebind retired.
    """

    def __init__(self) -> None:
        self.bound: dict[SubscriptionId, Binding] = {}
        self.generations: dict[SubscriptionId, int] = {}
        self.admission: dict[SubscriptionId, Admission] = {}
        self.exhausted = ExhaustedMarks()
        self.retired_budget_waits = 0

    def receivers(self) -> list[SubscriptionReceiver]:
        """Every current binding's receiver."""
        return [binding.receiver for binding in list(self.bound.values())]

    def reconnected(self) -> None:
        """The broker is back: the pull requests open before the outage died with the
        old connection, so every binding asks again at once."""
        for receiver in self.receivers():
            receiver.reconnected()


async def stop_all(receivers: list[SubscriptionReceiver]) -> None:
    """Stop every pull loop at once: each withdraws its inbox with a round trip of its
    own, which one after another a node with many parents would pay per subscription."""
    await asyncio.gather(*(receiver.stop() for receiver in receivers))


__all__ = ["Admission", "Binding", "Bindings", "stop_all"]
