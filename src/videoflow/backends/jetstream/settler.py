"""Settlement on JetStream across bindings: Settler, the part of
JetStreamMessagingBackend that queues settlements for its loop and sends them one
batch per binding (DeliveryLeases.settle_batch), confirmed or unknown, never assumed
(MSG-011, PAY-004, DELIV-15); renews and supersedes leases; and keeps the exhausted
marks a confirmed Terminal clears (MSG-012).

How a batch goes on the wire is jetstream.delivery_leases'.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from videoflow.backends.jetstream.bindings import Bindings
from videoflow.backends.jetstream.connection import CALL_MARGIN_SECONDS, Connection
from videoflow.backends.jetstream.subscription_receiver import SubscriptionReceiver
from videoflow.backends.messaging import (
    BrokerUnavailable,
    DeliveryToken,
    LeaseObservation,
    Receipt,
    SettleConfirmed,
    SettleOutcome,
    SettleResult,
    SettleStale,
    SettleUnknown,
    SubscriptionId,
    Terminal,
    require_settle_outcomes,
)
from videoflow.broker.loop import Handoff

logger = logging.getLogger(__name__)


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


def _result_by(receipt: Receipt[SettleResult], deadline: float) -> SettleResult:
    """A queued settlement's result, or SettleUnknown when the loop has not answered
    by the monotonic deadline (its own bound answers first; this only catches a stuck
    loop)."""
    try:
        return receipt.result(timeout=max(deadline - time.monotonic(), 0.0))
    except concurrent.futures.TimeoutError:
        return SettleUnknown("the backend's loop did not answer in time")


class Settler:
    """Settling what the bindings handed out, and their leases (settle_async,
    settle_many_async, settle_many, settle, renew, supersede, mark_exhausted).

    Arguments:
        connection: the loop the settlements go out on (its wake-up drains them).
        bindings: the bindings whose deliveries are settled, and their exhausted marks.
        ack_confirm_seconds: how long a settlement waits for the broker's reply.
    """

    def __init__(self, connection: Connection, bindings: Bindings,
                 ack_confirm_seconds: float) -> None:
        self.connection, self.bindings = connection, bindings
        self.ack_confirm_seconds = ack_confirm_seconds
        self._queued: Handoff[QueuedSettlement] = Handoff(
            connection.wake, self._drain,
            lambda queued, reason: resolve_settlements(queued, SettleUnknown(reason)))

    def settle_async(
        self, token: DeliveryToken, outcome: SettleOutcome, settlement_id: str
    ) -> Receipt[SettleResult]:
        """Queue one settlement and return at once. Settlements queued while the loop is
        busy go out together: one wake-up of the loop for the lot, and per durable one
        write of every acknowledgement with one round trip to confirm them
        (DeliveryLeases.settle_batch). The receipt always resolves, to what
        settle would return — SettleUnknown if the backend shuts down first.

        Raises:
            TypeError: outcome is not Completed, Retry or Terminal.
        """
        return self.settle_many_async([(token, outcome, settlement_id)])[0]

    def settle_many_async(
        self, settlements: Sequence[tuple[DeliveryToken, SettleOutcome, str]]
    ) -> list[Receipt[SettleResult]]:
        """Queue settlements and return at once, a receipt each (settle_async): one
        entry per binding, so per durable one write and one confirming round trip
        for the lot (DeliveryLeases.settle_batch).

        Raises:
            TypeError: an outcome is not Completed, Retry or Terminal (nothing is
                queued then).
        """
        require_settle_outcomes(settlements)
        runner = self.connection.runner
        receipts: list[Receipt[SettleResult]] = [Receipt(runner=runner) for _ in settlements]
        by_binding: dict[SubscriptionId, list[int]] = {}
        for index, (token, _, _) in enumerate(settlements):
            by_binding.setdefault(token.subscription, []).append(index)
        bound = self.bindings.bound
        for subscription, indexes in by_binding.items():
            binding = bound.get(subscription)
            if binding is None:
                for index in indexes:
                    receipts[index].set_result(SettleStale("the subscription is not bound "
                                                           "here"))
                continue
            self._queued.put(QueuedSettlement(
                binding.receiver, [settlements[i] for i in indexes],
                [receipts[i] for i in indexes]))
        return receipts

    def settle_many(
        self, settlements: Sequence[tuple[DeliveryToken, SettleOutcome, str]]
    ) -> list[SettleResult]:
        """Settle several deliveries with one wait (settle_many_async, waited for):
        per durable one round trip for the whole batch."""
        receipts = self.settle_many_async(settlements)
        deadline = time.monotonic() + self.ack_confirm_seconds + CALL_MARGIN_SECONDS
        return [_result_by(receipt, deadline) for receipt in receipts]

    def settle(
        self, token: DeliveryToken, outcome: SettleOutcome, settlement_id: str
    ) -> SettleResult:
        """Settle one delivery (settle_async, waited for): SettleStale for a token this
        binding does not hold live — nothing is sent (MSG-011); SettleConfirmed once
        the server replied; SettleUnknown otherwise (PAY-004). A confirmed Terminal
        clears that message's exhausted mark (MSG-012)."""
        return _result_by(self.settle_async(token, outcome, settlement_id),
                          time.monotonic() + self.ack_confirm_seconds + CALL_MARGIN_SECONDS)

    def fail_all(self, reason: str) -> None:
        """Answer every settlement still queued SettleUnknown(reason)."""
        self._queued.fail_all(reason)

    def _drain(self, queued: list[QueuedSettlement]) -> None:
        """On the loop: settle everything queued, one batch per binding."""
        batches: dict[SubscriptionReceiver, list[QueuedSettlement]] = {}
        for entry in queued:
            batches.setdefault(entry.receiver, []).append(entry)
        for receiver, batch in batches.items():
            self.connection.spawn(self._settle_batch(receiver, batch))

    async def _settle_batch(self, receiver: SubscriptionReceiver,
                            batch: list[QueuedSettlement]) -> None:
        items = [item for entry in batch for item in entry.items]
        try:
            results = await receiver.leases.settle_batch(items)
        except asyncio.CancelledError:
            resolve_settlements(batch, SettleUnknown("the backend shut down before the broker "
                                          "confirmed the settlement"))
            raise
        except Exception as error:
            # A bug here must not leave a caller waiting forever; say what happened.
            logger.exception("settlement batch failed")
            resolve_settlements(batch, SettleUnknown(f"the settlement failed: {error!r}"))
            return
        for (token, outcome, _), result in zip(items, results, strict=True):
            if isinstance(outcome, Terminal) and isinstance(result, SettleConfirmed):
                self.bindings.exhausted.clear(token.subscription, token.stream_seq)
        start = 0
        for entry in batch:
            entry.resolve(results[start:start + len(entry.items)])
            start += len(entry.items)

    def renew(self, token: DeliveryToken) -> LeaseObservation:
        binding = self.bindings.bound.get(token.subscription)
        if binding is None:
            return LeaseObservation("stale", "the subscription is not bound here")
        try:
            observed: LeaseObservation = self.connection.call(
                binding.receiver.leases.renew(token), self.ack_confirm_seconds)
        except (TimeoutError, BrokerUnavailable) as error:
            return LeaseObservation("unknown", f"the backend's loop did not answer: {error}")
        return observed

    def supersede(self, token: DeliveryToken) -> bool:
        binding = self.bindings.bound.get(token.subscription)
        if binding is None:
            return False

        async def retire() -> bool:
            return binding.receiver.leases.supersede(token)

        return bool(self.connection.call(retire(), self.ack_confirm_seconds))

    def mark_exhausted(self, subscription: SubscriptionId, stream_sequence: int | None) -> None:
        """Count a retained message as unresolved work in observe_subscription without a
        broker advisory (DELIV-15's pending handoff; MSG-012). stream_sequence None
        counts one anonymous message, cleared by the next Terminal of the subscription
        that matches no marked sequence. Cleared by the Terminal settlement of that
        message, or by the message leaving the stream."""
        self.bindings.exhausted.mark(subscription, stream_sequence)


__all__ = ["QueuedSettlement", "Settler", "resolve_settlements"]
