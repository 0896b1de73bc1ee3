"""Publication on JetStream: the subject an envelope goes to, and
BackendPublishing, the part of JetStreamMessagingBackend that queues publications for
its loop, sends them pipelined and resolves an unknown send by an idempotent
re-publish (MSG-013, MSG-014).

The wire side is jetstream.outcomes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time

from videoflow.backends.jetstream.backend_state import (
    BROKER_CALL_SECONDS,
    CALL_MARGIN_SECONDS,
    BackendState,
    QueuedPublication,
    resolve_publications,
)
from videoflow.backends.jetstream.outcomes import observe_by_republish, publish_pipelined
from videoflow.backends.jetstream.specs import stream_of
from videoflow.backends.messaging import (
    ChannelId,
    Envelope,
    PublicationUnknown,
    PublishOutcome,
    Receipt,
    Rejected,
)
from videoflow.backends.messaging_types import DUPLICATE_WINDOW_SECONDS
from videoflow.core.naming import dlq_stream_name, dlq_subject_for, eos_subject_for, subject_for

logger = logging.getLogger(__name__)


class BackendPublishing(BackendState):
    """Where envelopes go and how they are sent: the publication half of the contract
    (subject_for, publish_async, publish, observe_publication)."""

    def subject_for(self, channel: ChannelId, kind: str) -> str:
        """The subject envelopes of kind go to on channel (computed once per pair)."""
        key = (channel, kind)
        subject = self._subjects.get(key)
        if subject is None:
            subject = self._subjects[key] = self._subject_for(channel, kind)
        return subject

    def _subject_for(self, channel: ChannelId, kind: str) -> str:
        if kind == "data":
            return subject_for(channel.flow, channel.run, channel.node)
        if kind == "eos":
            return eos_subject_for(channel.flow, channel.run, channel.node)
        if kind == "dlq":
            return dlq_subject_for(channel.flow, channel.run, channel.node)
        raise ValueError(f"kind must be 'data', 'eos' or 'dlq', got {kind!r}")

    def publish_async(self, envelope: Envelope, deadline: float) -> Receipt[PublishOutcome]:
        """Queue a publication and return at once. Publications queued while the loop
        is busy go out together on one wake-up, each a request whose reply is its
        PubAck, all in flight at once and in the order they were made
        (jetstream.outcomes.publish_pipelined). The receipt always resolves, to what
        publish would return."""
        if self._js is None or not self.connected:
            # Nothing was sent; waiting helps unless the connection was given up.
            return Receipt(Rejected(f"{self._not_connected()}; nothing was sent",
                                    retryable=self.outage.given_up is None))
        receipt: Receipt[PublishOutcome] = Receipt(runner=self._runner)
        subject = envelope.subject or self.subject_for(envelope.channel, envelope.kind)
        self._publications.put((subject, envelope, deadline, receipt))
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

    def _drain_publications(self, queued: list[QueuedPublication]) -> None:
        self._spawn(self._publish_batch(queued))

    async def _publish_batch(self, queued: list[QueuedPublication]) -> None:
        client, replies, send_lock = self._client, self._replies, self._send_lock
        if client is None or replies is None or send_lock is None:
            resolve_publications(queued, Rejected("the JetStream backend is not "
                                                   "connected; nothing was sent",
                                                   retryable=True))
            return
        # First sends are recorded before anything is written: an unknown outcome is
        # resolved against its first send's time (observe_publication).
        self._ledger.sent_all([envelope for _, envelope, _, _ in queued],
                              horizon=DUPLICATE_WINDOW_SECONDS)
        try:
            await publish_pipelined(client, replies, queued, send_lock, self._js)
        except asyncio.CancelledError:
            resolve_publications(queued, PublicationUnknown(
                "the backend shut down before the receipt arrived"))
            raise
        except Exception as error:
            # A bug here must not leave a caller waiting forever; say what happened.
            logger.exception("publication batch failed")
            resolve_publications(queued, PublicationUnknown(f"the publication failed: "
                                                             f"{error!r}"))

    def _stream_of(self, envelope: Envelope) -> str:
        """The stream that captures envelope: its channel's, or the flow's DLQ."""
        if envelope.kind == "dlq":
            return dlq_stream_name(envelope.channel.flow)
        return stream_of(envelope.channel)

    def observe_publication(self, envelope: Envelope) -> PublishOutcome:
        """Resolve an earlier PublicationUnknown by an idempotent re-publish: inside the
        stream's duplicate window the broker answers duplicate when the first send was
        stored and stores it now when it was not — either way one accepted copy.
        Outside the window nothing can be known: Unresolvable."""
        if self._js is None or not self.connected:
            # The earlier send may have been stored: still unknown, never a refusal.
            return PublicationUnknown(self._not_connected())
        subject = self.subject_for(envelope.channel, envelope.kind)
        try:
            outcome: PublishOutcome = self._call(
                observe_by_republish(self._js, self._stream_of(envelope), subject,
                                     envelope, self._ledger, BROKER_CALL_SECONDS),
                2 * BROKER_CALL_SECONDS)
        except TimeoutError:
            return PublicationUnknown("the backend's loop did not answer")
        return outcome


__all__ = ["BackendPublishing"]
