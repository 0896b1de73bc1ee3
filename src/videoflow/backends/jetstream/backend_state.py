"""What the parts of JetStreamMessagingBackend share: the bounds of a call onto its
loop, the records of work queued for the loop (QueuedSettlement, QueuedPublication)
and of a bound subscription (Binding), and BackendState, the backend's state as the
parts read it.

The backend is one class composed of parts, one module each, by responsibility:
backend_provisioning (channels, durables and bindings), backend_publishing,
backend_receiving and backend_settlement; the connection's lifecycle and the
observations stay in backend.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Final

from nats.aio.client import Client
from nats.js import JetStreamContext

from videoflow.backends.jetstream.outcomes import PublicationLedger
from videoflow.backends.jetstream.reply_inbox import ReplyMux
from videoflow.backends.jetstream.specs import ExhaustedMarks
from videoflow.backends.jetstream.subscription_receiver import SubscriptionReceiver
from videoflow.backends.messaging import (
    ChannelId,
    Delivery,
    DeliveryToken,
    Envelope,
    PublishOutcome,
    Receipt,
    SettleOutcome,
    SettleResult,
    SubscriptionId,
    SubscriptionSpec,
    VerifiedSubscription,
)
from videoflow.broker.link import Outage
from videoflow.broker.loop import Handoff, LoopRunner

CALL_MARGIN_SECONDS: Final = 2.0
"""Added to a call's own bound when the caller's thread waits for the loop: the inner
bound answers first, and the outer one only catches a loop that is not running."""

BROKER_CALL_SECONDS: Final = 10.0
"""Bound of one provisioning or observation request."""


@dataclass(frozen=True, slots=True)
class QueuedSettlement:
    """Settlements of one binding from one call, and a receipt for each."""

    receiver: SubscriptionReceiver
    items: list[tuple[DeliveryToken, SettleOutcome, str]]
    receipts: list[Receipt[SettleResult]]

    def resolve(self, results: list[SettleResult]) -> None:
        for receipt, result in zip(self.receipts, results, strict=True):
            receipt.set_result(result)  # an answer already set holds


def resolve_settlements(queued: Sequence[QueuedSettlement], result: SettleResult) -> None:
    """Answer every queued settlement with the one result."""
    for entry in queued:
        entry.resolve([result] * len(entry.items))


QueuedPublication = tuple[str, Envelope, float, Receipt[PublishOutcome]]
"""(subject, envelope, deadline, the caller's receipt)."""


def resolve_publications(queued: Sequence[QueuedPublication], outcome: PublishOutcome) -> None:
    """Answer every queued publication with the one outcome."""
    for *_, receipt in queued:
        receipt.set_result(outcome)  # a receipt answered already keeps its answer


class Binding:
    """One bound subscription: its spec, read-back, operation id, stream, receiver and
    MAX_DELIVERIES advisory subscription."""

    def __init__(self, spec: SubscriptionSpec, verified: VerifiedSubscription,
                 operation_id: str, stream: str, receiver: SubscriptionReceiver) -> None:
        self.spec, self.verified, self.operation_id = spec, verified, operation_id
        self.stream, self.receiver = stream, receiver
        self.advisory: Any = None


class BackendState:
    """The state of a JetStreamMessagingBackend its parts read, and the methods one
    part calls on another, as annotations: set and defined by JetStreamMessagingBackend
    (its __init__, its lifecycle) and by the parts. Every part derives from this, so
    each reads the same declared types. Defined here: what two parts use and neither
    holds (connected, _spawn).
    """

    flow_id: str
    run_id: str
    prefetch: int
    fetch_timeout: float
    ack_confirm_seconds: float
    keepalive: bool
    byte_budget: int | None
    instance_id: str
    outage: Outage
    _runner: LoopRunner
    _client: Client | None
    _js: JetStreamContext | None
    _bindings: dict[SubscriptionId, Binding]
    _generations: dict[SubscriptionId, int]
    _admission: dict[SubscriptionId, tuple[Callable[[Delivery], bool],
                                           Callable[[Delivery], None] | None]]
    _exhausted: ExhaustedMarks
    _ledger: PublicationLedger
    _first_stream: Any
    _stopped_receiving: bool
    _retired_budget_waits: int
    _publications: Handoff[QueuedPublication]
    _settlements: Handoff[QueuedSettlement]
    _pipelined: set[asyncio.Task[None]]
    _subjects: dict[tuple[ChannelId, str], str]
    _wanted: int
    _replies: ReplyMux | None
    _send_lock: asyncio.Lock | None
    _arrivals: threading.Condition
    _arrived: int
    _ring_scheduled: bool
    # Defined by JetStreamMessagingBackend (lifecycle) and BackendReceiving.
    _call: Callable[[Any, float], Any]
    _ride: Callable[[Callable[[JetStreamContext], Coroutine[Any, Any, Any]]], Any]
    _require: Callable[[], tuple[Client, JetStreamContext]]
    _not_connected: Callable[[], str]
    _ring: Callable[[], None]
    _budget_admits: Callable[[], bool]

    @property
    def connected(self) -> bool:
        return self._client is not None and self._client.is_connected

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._pipelined.add(task)  # a strong reference until it is done
        task.add_done_callback(self._pipelined.discard)


__all__ = [
    "BROKER_CALL_SECONDS",
    "CALL_MARGIN_SECONDS",
    "BackendState",
    "Binding",
    "QueuedPublication",
    "QueuedSettlement",
    "resolve_publications",
    "resolve_settlements",
]
