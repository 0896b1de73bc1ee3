"""Publication on JetStream: Publisher, the part of JetStreamMessagingBackend that
says which subject an envelope goes to, queues publications for the loop, sends them
pipelined and resolves an unknown send by an idempotent re-publish (MSG-013,
MSG-014).

Packs: the packable envelopes (Envelope.packable: a live producer's small outputs)
queued one after another for one subject while the loop was busy go out as one message
(videoflow.wire.packs), up to PACK_MEMBERS or PACK_BYTES, and the pack's PubAck answers
each. Nothing waits to be packed: one queued alone goes alone, so a paced producer's
outputs go as they did, and a fast one's bursts go in packs. The broker's cost is per
message: at 20,000 small messages/s it was 70 us of nats-server CPU per message, end to
end, on the 2-core bench host. A pack's id is its first member's with ``+{count}``; an
unknown outcome is resolved by re-publishing the pack whole, under that id.

The wire side is jetstream.outcomes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable, Sequence

from videoflow.backends.jetstream.connection import (
    BROKER_CALL_SECONDS,
    CALL_MARGIN_SECONDS,
    Connection,
)
from videoflow.backends.jetstream.outcomes import (
    PublicationLedger,
    observe_by_republish,
    publish_pipelined,
)
from videoflow.backends.jetstream.specs import stream_of
from videoflow.backends.messaging import (
    ChannelId,
    Envelope,
    PublicationUnknown,
    PublishOutcome,
    Receipt,
    Rejected,
    channel_subject,
)
from videoflow.backends.messaging_types import DUPLICATE_WINDOW_SECONDS, pack_envelope
from videoflow.broker.loop import Handoff
from videoflow.core.naming import dlq_stream_name
from videoflow.wire.packs import PACK_BYTES, PACK_MEMBERS

logger = logging.getLogger(__name__)

QueuedPublication = tuple[str, Envelope, float, Receipt[PublishOutcome]]
"""(subject, envelope, deadline, the caller's receipt)."""

PACKED_KEPT = 4096
"""Members of packs whose outcome was unknown, remembered for observe_publication."""


def resolve_publications(queued: Sequence[QueuedPublication], outcome: PublishOutcome) -> None:
    """Answer every queued publication with the one outcome."""
    for *_, receipt in queued:
        receipt.set_result(outcome)  # a receipt answered already keeps its answer


class _PackReceipt(Receipt[PublishOutcome]):
    """A pack's receipt: its answer is each member's (and an unknown one is
    remembered, so each member's is resolved by re-publishing the pack)."""

    __slots__ = ("envelope", "members", "unknown")

    def __init__(self, envelope: Envelope, members: list[QueuedPublication],
                 unknown: Callable[[Envelope, list[QueuedPublication]], None]) -> None:
        super().__init__()
        self.envelope, self.members, self.unknown = envelope, members, unknown

    def set_result(self, answer: PublishOutcome) -> None:
        if self.done():
            return
        super().set_result(answer)
        if isinstance(answer, PublicationUnknown):
            self.unknown(self.envelope, self.members)
        resolve_publications(self.members, answer)


def pack_runs(queued: list[QueuedPublication],
              unknown: Callable[[Envelope, list[QueuedPublication]], None]
              ) -> list[QueuedPublication]:
    """queued, each run of packable envelopes for one subject made one pack of at most
    PACK_MEMBERS envelopes and PACK_BYTES (see the module); the rest as they are, in
    order.

    Arguments:
        queued: publications, in the order they were made.
        unknown: called with a pack and its members when the pack's outcome is
            PublicationUnknown (before the members are answered).

    Returns:
        the publications to send: a pack's receipt answers each of its members'.
    """
    out: list[QueuedPublication] = []
    run: list[QueuedPublication] = []
    size = 0
    for item in queued:
        subject, envelope = item[0], item[1]
        if not envelope.packable:
            if run:
                out.append(_pack(run, unknown))
                run = []
            out.append(item)
            continue
        if run and (run[0][0] != subject or len(run) == PACK_MEMBERS
                    or size + len(envelope.data) > PACK_BYTES):
            out.append(_pack(run, unknown))
            run = []
        if not run:
            size = 0
        run.append(item)
        size += len(envelope.data)
    if run:
        out.append(_pack(run, unknown))
    return out


def _pack(run: list[QueuedPublication],
          unknown: Callable[[Envelope, list[QueuedPublication]], None]) -> QueuedPublication:
    """One publication for run: itself when alone, else one pack of it."""
    if len(run) == 1:
        return run[0]
    pack = pack_envelope([item[1] for item in run])
    return run[0][0], pack, min(item[2] for item in run), _PackReceipt(pack, run, unknown)


class Publisher:
    """Where envelopes go and how they are sent: the publication half of the contract
    (subject_for, publish_async, publish, observe_publication).

    Arguments:
        connection: the connection the publications go out on; its loop's wake-up
            drains them (a publisher made before the settler drains first: a group's
            outputs go before the settlements queued with them).

    Attributes:
        ledger: each envelope's first send, which an unknown outcome is resolved
            against (observe_publication).
    """

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.ledger = PublicationLedger()
        self._subjects: dict[tuple[ChannelId, str], str] = {}
        # (channel, msg_id) of a member of a pack whose outcome was unknown -> the pack
        self._packed: dict[tuple[ChannelId, str | None], Envelope] = {}
        # A packable envelope was queued since the last batch went out: only then is
        # a batch looked through for packs (a flag may let one batch go unpacked).
        self._packable = False
        self._queued: Handoff[QueuedPublication] = Handoff(
            connection.wake, self._drain,
            lambda queued, reason: resolve_publications(
                queued, Rejected(f"nothing was sent: {reason}", retryable=True)))

    def subject_for(self, channel: ChannelId, kind: str) -> str:
        """The subject envelopes of kind go to on channel (computed once per pair)."""
        key = (channel, kind)
        subject = self._subjects.get(key)
        if subject is None:
            subject = self._subjects[key] = channel_subject(channel, kind)
        return subject

    def publish_async(self, envelope: Envelope, deadline: float) -> Receipt[PublishOutcome]:
        """Queue a publication and return at once. Publications queued while the loop
        is busy go out together on one wake-up, each a request whose reply is its
        PubAck, all in flight at once and in the order they were made
        (jetstream.outcomes.publish_pipelined). The receipt always resolves, to what
        publish would return."""
        connection = self.connection
        if connection.js is None or not connection.connected:
            # Nothing was sent; waiting helps unless the connection was given up.
            return Receipt(Rejected(f"{connection.not_connected()}; nothing was sent",
                                    retryable=connection.outage.given_up is None))
        receipt: Receipt[PublishOutcome] = Receipt(runner=connection.runner)
        subject = envelope.subject or self.subject_for(envelope.channel, envelope.kind)
        if envelope.packable:
            self._packable = True
        self._queued.put((subject, envelope, deadline, receipt))
        return receipt

    def publish(self, envelope: Envelope, deadline: float) -> PublishOutcome:
        """Publish with a monotonic deadline (publish_async, waited for); on expiry the
        outcome is PublicationUnknown, never a guess (MSG-013, MSG-014).

        Returns:
            as publish_once; Rejected(retryable=True) when not connected (nothing sent).
        """
        receipt = self.publish_async(envelope, deadline)
        wait = max(deadline - time.monotonic(), 0.0) + CALL_MARGIN_SECONDS
        try:
            return receipt.result(timeout=wait)
        except concurrent.futures.TimeoutError:
            return PublicationUnknown("the backend's loop did not answer before the deadline")

    def fail_all(self, reason: str) -> None:
        """Answer every publication still queued Rejected (retryable): nothing was sent."""
        self._queued.fail_all(reason)

    def _drain(self, queued: list[QueuedPublication]) -> None:
        self.connection.spawn(self._publish_batch(queued))

    async def _publish_batch(self, queued: list[QueuedPublication]) -> None:
        if self._packable:
            self._packable = False
            if len(queued) > 1:
                queued = pack_runs(queued, self._remember)
        connection = self.connection
        client, replies, send_lock = connection.client, connection.replies, connection.send_lock
        if client is None or replies is None or send_lock is None:
            resolve_publications(queued, Rejected("the JetStream backend is not "
                                                   "connected; nothing was sent",
                                                   retryable=True))
            return
        # First sends are recorded before anything is written: an unknown outcome is
        # resolved against its first send's time (observe_publication).
        self.ledger.sent_all([envelope for _, envelope, _, _ in queued],
                             horizon=DUPLICATE_WINDOW_SECONDS)
        try:
            await publish_pipelined(client, replies, queued, send_lock, connection.js)
        except asyncio.CancelledError:
            resolve_publications(queued, PublicationUnknown(
                "the backend shut down before the receipt arrived"))
            raise
        except Exception as error:
            # A bug here must not leave a caller waiting forever; say what happened.
            logger.exception("publication batch failed")
            resolve_publications(queued, PublicationUnknown(f"the publication failed: "
                                                             f"{error!r}"))

    def _remember(self, pack: Envelope, members: list[QueuedPublication]) -> None:
        """Members of a pack whose outcome is unknown: observe_publication of one
        re-publishes the pack."""
        packed = self._packed
        for _, envelope, _, _ in members:
            packed[(envelope.channel, envelope.msg_id)] = pack
        while len(packed) > PACKED_KEPT:
            del packed[next(iter(packed))]

    @staticmethod
    def _stream_of(envelope: Envelope) -> str:
        """The stream that captures envelope: its channel's, or the flow's DLQ."""
        if envelope.kind == "dlq":
            return dlq_stream_name(envelope.channel.flow)
        return stream_of(envelope.channel)

    def observe_publication(self, envelope: Envelope) -> PublishOutcome:
        """Resolve an earlier PublicationUnknown by an idempotent re-publish: inside the
        stream's duplicate window the broker answers duplicate when the first send was
        stored and stores it now when it was not — either way one accepted copy.
        Outside the window nothing can be known: Unresolvable."""
        connection = self.connection
        if connection.js is None or not connection.connected:
            # The earlier send may have been stored: still unknown, never a refusal.
            return PublicationUnknown(connection.not_connected())
        # A member of a pack is resolved with its pack: one accepted copy of that.
        envelope = self._packed.pop((envelope.channel, envelope.msg_id), envelope)
        subject = self.subject_for(envelope.channel, envelope.kind)
        try:
            outcome: PublishOutcome = connection.call(
                observe_by_republish(connection.js, self._stream_of(envelope), subject,
                                     envelope, self.ledger, BROKER_CALL_SECONDS),
                2 * BROKER_CALL_SECONDS)
        except TimeoutError:
            return PublicationUnknown("the backend's loop did not answer")
        return outcome


__all__ = ["PACK_BYTES", "PACK_MEMBERS", "Publisher", "QueuedPublication", "pack_runs",
           "resolve_publications"]
