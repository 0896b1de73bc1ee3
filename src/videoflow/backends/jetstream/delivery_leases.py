"""The settlement and leases of one binding's deliveries on JetStream: the
acknowledgement verbs as nats-py writes them, how a batch of settlements of one durable
goes on the wire (plan_sends), the record of a delivery held live (HeldDelivery), and
DeliveryLeases, the part of a SubscriptionReceiver that settles its tokens, confirmed
with the server and fenced (MSG-011, PAY-004, DELIV-15), and keeps their leases alive.

plan_sends: how a batch of settlements of one durable goes on the wire. Only the last
settlement of the batch, and every Retry or Terminal, is sent as a request; a
Completed before one of those is a plain +ACK publish that the next request's reply
confirms. That is sound because the server processes one durable's acknowledgements
in arrival order (consumer.go: pushAck queues them on the consumer's ackMsgs queue,
and one goroutine, processInboundAcks, applies them first in, first out), and one
connection's messages arrive in the order they were written — so the reply to a
request means every acknowledgement written before it on this connection to the same
durable was processed. The reply never says more than "processed" (NATS_FACTS §1:
the server answers a re-ack of an acked message with the same empty reply), so
nothing is lost against one ack_sync per message: an unconfirmed request leaves its
whole run of settlements unknown (PAY-004), and a lost durable (no responders) too.

Everything here runs on the adapter's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from videoflow.backends.jetstream.reply_inbox import ReplyMux, no_responders
from videoflow.backends.messaging import (
    Completed,
    Delivery,
    DeliveryToken,
    LeaseObservation,
    Retry,
    SettleConfirmed,
    SettleOutcome,
    SettleResult,
    SettleStale,
    SettleUnknown,
    SubscriptionId,
    Terminal,
)
from videoflow.broker.client import FastHeadersClient

ACK: Final = b"+ACK"
NAK: Final = b"-NAK"
TERM: Final = b"+TERM"
"""The acknowledgement verbs as nats-py's Msg.ack / Msg.nak / Msg.term write them
(nats/aio/msg.py Msg.Ack)."""

_CROSSED: Final = ("the connection was replaced while the settlement was on the wire: it "
                   "may have gone with the old one")
_SETTLEMENTS_KEPT: Final = 4096
_RECENT_ACKS: Final = 1024
"""Confirmed acknowledgements kept to send again after a reconnect (reack_recent)."""
"""Settlement ids remembered for idempotent retries."""

_NOT_LIVE: Final = ("not a live delivery of this binding (superseded, settled, handed back "
                    "or from an earlier generation)")


def nak_payload(delay: float) -> bytes:
    """-NAK with the delay in nanoseconds, byte for byte as Msg.nak(delay) sends it;
    a zero delay is no delay, as there (`if delay:`; NATS_FACTS §1)."""
    if not delay:
        return NAK
    return NAK + b" " + json.dumps({"delay": int(delay * 10**9)}).encode()


def _wire_form(outcome: SettleOutcome) -> tuple[bytes, bool]:
    """(payload, must_request): Retry and Terminal want their own reply."""
    if isinstance(outcome, Completed):
        return ACK, False
    if isinstance(outcome, Retry):
        return nak_payload(outcome.delay), True
    if isinstance(outcome, Terminal):
        return term_payload(outcome.record_ref), True
    raise TypeError(f"not a settle outcome: {outcome!r}")


def term_payload(record_ref: str) -> bytes:
    """+TERM with the dead letter's reference as the reason, which the server carries
    into the MSG_TERMINATED advisory. nats-py's Msg.term takes no reason (NATS_FACTS
    S12); a line break would end the protocol message, so it becomes a space."""
    reason = " ".join(record_ref.split())
    return TERM + b" " + reason.encode()


class Send(NamedTuple):
    """One settlement as it goes on the wire.

    Attributes:
        slot: its position in the caller's batch.
        subject: the delivery's $JS.ACK reply subject.
        payload: +ACK, -NAK [delay] or +TERM reason.
        request: sent as a request; its reply confirms it and every plain send before
            it since the previous request (a run).
    """

    slot: int
    subject: str
    payload: bytes
    request: bool


def plan_sends(settlements: Sequence[tuple[int, str, bytes, bool]]) -> list[list[Send]]:
    """Split one durable's settlements, in order, into runs that each end in a request.

    Arguments:
        settlements: (index, subject, payload, must_request) in the order they are to
            be written; must_request for a Retry or Terminal, whose own reply is wanted.

    Returns:
        The runs. Every run's last send is a request and no other send is; the batch's
        last settlement always ends a run, so nothing is left unconfirmed.
    """
    runs: list[list[Send]] = []
    run: list[Send] = []
    last = len(settlements) - 1
    for position, (index, subject, payload, must_request) in enumerate(settlements):
        request = must_request or position == last
        run.append(Send(index, subject, payload, request))
        if request:
            runs.append(run)
            run = []
    return runs


@dataclass(slots=True)
class HeldDelivery:
    """A delivery this binding holds live: parked, or handed out and not yet settled."""

    delivery: Delivery
    msg: Msg
    parked: bool = True
    # An acknowledgement went out and its answer never came (a broker outage, a
    # consumer changing leader): the keepalive stops renewing it and sends the ack
    # again instead (reack_unknown), so a lost ack is neither held forever nor left to
    # ack_wait's redelivery.
    acked_unknown: bool = False


class DeliveryLeases:
    """Settling and renewing the deliveries one binding handed out: what speaks to the
    broker about a delivery after it was taken.

    Arguments:
        subscription / generation: the binding's; a token of another is never live.
        client: the connection the settlements are written on.
        replies: the connection's reply inbox, which confirms them.
        ack_confirm_seconds: how long a settlement waits for the server's reply.
        held: the binding's live deliveries by stream sequence, parked or handed out
            (its PrefetchQueue's, which parks into it): a confirmed settlement removes
            one, an unanswered acknowledgement marks it (acked_unknown).
    """

    def __init__(self, subscription: SubscriptionId, generation: int, client: Client,
                 replies: ReplyMux, ack_confirm_seconds: float,
                 held: dict[int, HeldDelivery]) -> None:
        self.subscription, self.generation = subscription, generation
        self.client, self.replies = client, replies
        self.ack_confirm_seconds = ack_confirm_seconds
        self.held = held
        # OrderedDict: popitem(last=False) is O(1), where deleting next(iter(dict)) over
        # and over scans the dead slots a dict keeps at its front.
        self._settled: OrderedDict[str, tuple[DeliveryToken, SettleResult]] = OrderedDict()
        self._in_flight: dict[int, tuple[DeliveryToken, int,
                                         asyncio.Future[dict[int, SettleResult]]]] = {}
        # The $JS.ACK subjects of the latest confirmed +ACKs, oldest first (reack_recent).
        self._recent_acks: deque[str] = deque(maxlen=_RECENT_ACKS)
        self.stopping = False  # set once the binding stops: nothing is renewed after
        self._keepalive: asyncio.Task[None] | None = None

    async def _publish(self, subject: str, payload: bytes, reply: str = "") -> None:
        """Send one settlement (or its request): through the fast client's publish_now
        where it is one, sparing the two coroutines nats-py's publish makes for each."""
        client = self.client
        if isinstance(client, FastHeadersClient):
            if client.publish_now(subject, reply, payload, None, repeated=False):
                await client.flush_over()
        else:
            await client.publish(subject, payload, reply=reply)

    def live(self, token: DeliveryToken) -> bool:
        """Whether token is the newest attempt of its message this binding handed out
        and has not settled (MSG-011)."""
        held = self.held.get(token.stream_seq)
        return (token.subscription == self.subscription and token.generation == self.generation
                and held is not None and not held.parked
                and (held.delivery.token is token or held.delivery.token == token))

    async def settle(
        self, token: DeliveryToken, outcome: SettleOutcome, settlement_id: str
    ) -> SettleResult:
        """Settle one delivery and confirm it with the server (settle_batch of one)."""
        return (await self.settle_batch([(token, outcome, settlement_id)]))[0]

    async def settle_batch(
        self, settlements: Sequence[tuple[DeliveryToken, SettleOutcome, str]]
    ) -> list[SettleResult]:
        """Settle deliveries of this binding, pipelined, and confirm each with the server.

        Every settlement is the very +ACK / -NAK [delay] / +TERM reason that Msg.ack,
        Msg.nak(delay) and Msg.term write (NATS_FACTS §1), Terminal carrying its
        record_ref as the TERM reason (S12, DELIV-15). They are all written at once and
        confirmed by the server's replies: every Retry and Terminal, and the batch's
        last settlement, go as requests, and a Completed before a request is confirmed
        by that request's reply (plan_sends: the server applies one durable's
        acknowledgements in order). So a batch costs one round trip, not one per
        delivery.

        Returns:
            One result per settlement, in order: SettleStale when the token is not live
            — nothing is sent (MSG-011); SettleConfirmed once the reply that covers it
            arrived; SettleUnknown when it did not within ack_confirm_seconds, or the
            durable is gone, or the connection failed (a timed-out settlement may still
            have been applied: no payload obligation may be released on it, PAY-004).
            An unknown settlement leaves the token live, so a retry with the same
            settlement_id asks again; a repeated settlement_id of a settled token
            returns the first result. A settlement of a token whose earlier one is
            still in flight sends nothing and gets what it would have got after it:
            the first's result for the same settlement_id, SettleStale if the first
            was confirmed, the first's SettleUnknown otherwise.
        """
        results: list[SettleResult | None] = [None] * len(settlements)
        wire: list[tuple[int, str, bytes, bool]] = []
        followers: list[tuple[int, int, asyncio.Future[dict[int, SettleResult]]]] = []
        # One future for the whole batch, read by any settlement of the same token made
        # while this one is in flight; keyed by stream sequence, which hashes for free.
        answered: asyncio.Future[dict[int, SettleResult]] = (
            asyncio.get_running_loop().create_future())
        mine: list[int] = []
        for index, (token, outcome, settlement_id) in enumerate(settlements):
            previous = self._settled.get(settlement_id)
            in_flight = self._in_flight.get(token.stream_seq)
            if previous is not None and previous[0] == token:
                results[index] = previous[1]
            elif in_flight is not None and in_flight[0] == token:
                followers.append((index, in_flight[1], in_flight[2]))
            elif not self.live(token):
                results[index] = SettleStale(_NOT_LIVE)
            else:
                wire.append((index, self.held[token.stream_seq].msg.reply,
                             *_wire_form(outcome)))
                if in_flight is None:
                    self._in_flight[token.stream_seq] = (token, index, answered)
                    mine.append(token.stream_seq)
        sent: dict[int, SettleResult] = {}
        try:
            if wire:
                sent = await self._send_confirmed(wire)
                subjects = {entry[0]: entry[1] for entry in wire}
                for index, result in sent.items():
                    token, outcome, settlement_id = settlements[index]
                    if isinstance(result, SettleConfirmed):
                        self._forget(token)
                        self._settled[settlement_id] = (token, result)
                        if isinstance(outcome, Completed):
                            self._recent_acks.append(subjects[index])
                    elif isinstance(outcome, Completed):
                        self._lapse(token)
                    results[index] = result
                while len(self._settled) > _SETTLEMENTS_KEPT:
                    self._settled.popitem(last=False)
        finally:
            for seq in mine:
                del self._in_flight[seq]
            answered.set_result(sent)
        for index, first, batch in followers:
            # As if made after the first had returned: its own id repeats its result, a
            # confirmed first leaves the token stale, an unknown one leaves it unknown.
            token, _, settlement_id = settlements[index]
            result = (await asyncio.shield(batch)).get(
                first, SettleUnknown("the settlement was interrupted"))
            previous = self._settled.get(settlement_id)
            if previous is not None and previous[0] == token:
                results[index] = previous[1]
            elif isinstance(result, SettleConfirmed):
                results[index] = SettleStale(_NOT_LIVE)
            else:
                results[index] = result
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]  # every slot was filled above

    async def _send_confirmed(
        self, wire: list[tuple[int, str, bytes, bool]], again: bool = True
    ) -> dict[int, SettleResult]:
        """Write the planned runs and wait for their replies; a result per batch index.

        A reply that came after the connection was replaced confirms its request, not
        the plain acknowledgements before it: those may have been written to the old
        connection and gone with it, while the request, written after, reached the new
        one (a broker killed mid-batch: 30 inputs stayed pending on the restarted
        server, confirmed here, and the run waited for a redelivery that never came).
        They are sent once more, confirmed on their own (+ACK is idempotent), when
        again; else, or crossing a reconnect a second time, they are unknown."""
        runs = plan_sends(wire)
        written: list[tuple[list[Send], str, asyncio.Future[Msg]]] = []
        failure = ""
        reconnects = self.client.stats["reconnects"]
        try:
            await self.replies.start()
            for run in runs:
                for send in run:
                    if not send.request:
                        await self._publish(send.subject, send.payload)
                        continue
                    subject, reply = self.replies.expect()
                    try:
                        await self._publish(send.subject, send.payload, subject)
                    except BaseException:
                        self.replies.abandon(subject)
                        raise
                    written.append((run, subject, reply))
        except nats.errors.Error as error:
            # What went out may still be applied, what did not is not: unknown either way.
            failure = f"{type(error).__name__} while sending the settlement: {error}"
        results: dict[int, SettleResult] = {}
        if written:
            await asyncio.wait([reply for _, _, reply in written],
                               timeout=self.ack_confirm_seconds)
        for run, subject, reply in written:
            result: SettleResult
            if not reply.done():
                self.replies.abandon(subject)
                result = SettleUnknown(f"no reply within {self.ack_confirm_seconds:g}s; the "
                                       "settlement may or may not have been applied")
            elif no_responders(reply.result()):
                result = SettleUnknown("no responders: the durable is gone")  # S14
            else:
                result = SettleConfirmed()
            results.update((send.slot, result) for send in run)
        for run in runs[len(written):]:
            results.update((send.slot, SettleUnknown(failure)) for send in run)
        if self.client.stats["reconnects"] != reconnects:
            crossed = {send.slot for run, _, _ in written for send in run
                       if not send.request and isinstance(results[send.slot], SettleConfirmed)}
            results.update((slot, SettleUnknown(_CROSSED)) for slot in crossed)
            if again and crossed:
                results.update(await self._send_confirmed(
                    [entry for entry in wire if entry[0] in crossed], again=False))
        return results

    def _forget(self, token: DeliveryToken) -> None:
        held = self.held.get(token.stream_seq)
        if held is not None and (held.delivery.token is token or held.delivery.token == token):
            del self.held[token.stream_seq]

    def _lapse(self, token: DeliveryToken) -> None:
        held = self.held.get(token.stream_seq)
        if held is not None and (held.delivery.token is token or held.delivery.token == token):
            held.acked_unknown = True

    def supersede(self, token: DeliveryToken) -> bool:
        """Retire token locally with no broker call; a later settle is SettleStale."""
        live = self.live(token)
        if live:
            self._forget(token)
        return live

    async def renew(self, token: DeliveryToken) -> LeaseObservation:
        """Extend a live delivery's lease with Msg.in_progress (+WPI, fire-and-forget:
        'extended' means asked, NATS_FACTS §1); a stale token sends nothing."""
        if not self.live(token):
            return LeaseObservation("stale", "not a live delivery of this binding")
        try:
            await self.held[token.stream_seq].msg.in_progress()
        except nats.errors.Error as error:
            return LeaseObservation("unknown", f"{type(error).__name__}: {error}")
        return LeaseObservation("extended")

    def keep_alive(self, interval: float) -> None:
        """Renew every live lease each interval seconds (ack_wait / 3) until stop."""
        async def renewing() -> None:
            while not self.stopping:
                await asyncio.sleep(interval)
                await self.renew_all()

        if self._keepalive is None and not self.stopping:
            self._keepalive = asyncio.get_running_loop().create_task(renewing())

    async def stop_keep_alive(self) -> None:
        """Cancel the keepalive (the binding stops) and wait for it to end."""
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._keepalive
            self._keepalive = None

    def unanswered(self) -> bool:
        """Whether an acknowledgement of a live delivery is still unanswered."""
        return any(h.acked_unknown for h in list(self.held.values()))

    async def renew_all(self) -> int:
        """in_progress for every live delivery, parked or handed out (the keepalive),
        but those acknowledged without an answer (left to lapse, HeldDelivery.acked_unknown);
        returns how many were asked."""
        asked = 0
        for held in list(self.held.values()):
            if held.acked_unknown:
                continue
            with contextlib.suppress(nats.errors.Error):
                await held.msg.in_progress()
                asked += 1
        await self.reack_unknown()
        return asked

    async def reack_recent(self) -> int:
        """Send again the latest confirmed acknowledgements (plain +ACKs, idempotent),
        after a reconnect: a server killed and restarted on its store answers an ack
        before it writes the consumer's state, so the latest ones it confirmed can be
        pending again when it is back, or handed out again (as a new attempt:
        SubscriptionReceiver.attempt_of), and processed twice. One already applied is
        ignored.

        Returns:
            how many were sent.
        """
        subjects = list(self._recent_acks)
        for subject in subjects:
            await self._publish(subject, ACK)
        return len(subjects)

    async def reack_unknown(self) -> int:
        """Send again, confirmed, every acknowledgement whose answer never came: the
        node finished with those deliveries, and +ACK is idempotent, so a lost one is
        made good as soon as the broker answers again (the next keepalive, or its
        return after an outage) rather than redelivered to be processed again. Those
        still unanswered stay so, for the next try or ack_wait.

        Returns:
            how many were confirmed now.
        """
        lapsed = [(h.delivery.token, Completed(),
                   f"re-ack:{h.delivery.token.stream_seq}:{h.delivery.token.attempt}")
                  for h in list(self.held.values()) if h.acked_unknown and not h.parked]
        if not lapsed or self.stopping:
            return 0
        results = await self.settle_batch(lapsed)
        return sum(isinstance(r, SettleConfirmed) for r in results)


__all__ = [
    "ACK",
    "NAK",
    "TERM",
    "DeliveryLeases",
    "HeldDelivery",
    "Send",
    "nak_payload",
    "plan_sends",
    "term_payload",
]
