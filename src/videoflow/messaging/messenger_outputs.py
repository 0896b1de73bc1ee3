"""What a node's messenger publishes, and under which ids (the NATS messenger's part).

Outputs mints each output's identity -- trace id, sequence and message id -- encodes
its envelope, and hands it to the publication window (videoflow.messaging.
messenger_window) without waiting: inline, or by ref through the payload store when it
is over the inline limit. It also keeps a replayable producer's source offsets
(MSGID-6), commits a checkpoint carried with an output once that output is accepted
(RUN-022), and publishes a replica's end marker (clean or abort), waiting for its
outcome.

Message ids, so that a re-publish deduplicates and nothing else does: a processor's
output is keyed by its input group ({node}:{group key}:{k}); a replayable producer's by
its source offset (MSGID-6); a live producer's is {node}:{epoch}:{n} (MSGID-5) where the
node part is '<node>#<replica>', since owner epochs are per replica, plus
'~<incarnation>' when the ledger dies with the process and so restarts its epochs at 1.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, Final

import msgspec

from videoflow import clock
from videoflow.backends.messaging import (
    Accepted,
    ChannelId,
    Envelope,
    Known,
    MessagingBackend,
    Rejected,
)
from videoflow.backends.messaging_types import trusted_envelope
from videoflow.backends.payload import PayloadStore, inline_threshold
from videoflow.core.constants import BATCH, REALTIME
from videoflow.core.engine import CHECKPOINT_METADATA_KEY
from videoflow.core.runtime import FlowRuntime
from videoflow.errors import DurabilityUnavailable
from videoflow.messaging.grouping import ReadyGroup
from videoflow.messaging.messenger_deliveries import Deliveries, end_marker
from videoflow.messaging.messenger_payloads import MessengerPayloads
from videoflow.messaging.messenger_window import PublicationFailed, PublishWindow
from videoflow.messaging.publication import PublicationStats, publish_until_known
from videoflow.messaging.tracing import GroupTrace, NodeTracing
from videoflow.wire.codecs import CodecChoice
from videoflow.wire.numpy_ext import code_message
from videoflow.wire.offload import GatheredMessage, encode_message, gather_message
from videoflow.wire.serialization import OutputEncoder

_Header = tuple[str, int, "dict[str, Any] | None", "float | None", Any]
"""An output's own envelope fields, in OutputEncoder.encode's order: trace_id, seq,
metadata, event_ts, partition_key."""

PACK_MEMBER_BYTES: Final = 16 * 1024
"""The largest output a node with pack=True lets travel in a pack: small messages,
whose cost is the broker's per message, not per byte."""

OFFSET_COMMIT_SECONDS: Final = 0.1
"""How often a replayable producer records its last confirmed source offset while its
outputs stream (MSGID-6)."""


def require_durable_ledger(runtime: FlowRuntime, node_name: str) -> None:
    """Refuse a checkpoint the runtime cannot keep.

    Raises:
        DurabilityUnavailable: the ledger dies with the process (RUN-022).
    """
    if not runtime.durable_shared():
        raise DurabilityUnavailable(
            f"{node_name}: the runtime ledger dies with this process, so a checkpoint "
            "would not be durable (RUN-022); configure a NATS KV runtime")


def _also(first: Callable[[Accepted], None] | None,
          then: Callable[[Accepted], None]) -> Callable[[Accepted], None]:
    if first is None:
        return then

    def both(outcome: Accepted) -> None:
        first(outcome)
        then(outcome)

    return both


class Outputs:
    """A node replica's outputs: their ids, envelopes and publication.

    Arguments:
        node_name / channel / flow_type: the node, its own channel and the run's type.
        replica_id / nb_tasks: this replica and the node's replica count (end markers).
        backend / runtime / payloads / deliveries / window / stats: the messenger's
            backend, ledger, payload part, delivery part (its drop counts),
            publication window and publication counters.
        ack_wait: how long an end marker's outcome is waited for, seconds.
        replayable: outputs are minted from source offsets (MSGID-6).
        payload_store / blob_reader_ids: the obligation-keeping store and the reader
            obligations each put acquires (see NATSMessenger).
        tracing: the node replica's tracing (each output's traceparent and publish
            span); None: headers only, whatever tracer is configured.
        codecs: the codecs its outputs' arrays are encoded with.
        packs: small outputs may travel in packs (Node's pack), in a BATCH run, for
            outputs without a partition key or a checkpoint, of at most
            PACK_MEMBER_BYTES: a live producer's as Envelope.packable, a processor's
            as PublishWindow.send's packable.

    Attributes:
        group_outputs: outputs published for the input group in hand; the messenger
            sets it to 0 as it hands out a group.
        live_id_node: the node part of a live producer's message ids.
        source_offset: a replayable producer's last minted source offset.
        given_offset: the source offset the next output is minted from, when its
            source gave one (a stream sequence: set_output_source_offset); else the
            last one + 1.
        accepted_outputs: a replayable producer's outputs accepted in this process, in
            the order published (a producer's outputs resolve in order, and one not
            accepted fails it): a source acknowledges what they were made from.
    """

    def __init__(self, node_name: str, channel: ChannelId, flow_type: str, replica_id: int,
                 nb_tasks: int, backend: MessagingBackend, runtime: FlowRuntime,
                 payloads: MessengerPayloads, deliveries: Deliveries, window: PublishWindow,
                 stats: PublicationStats, ack_wait: float, *, replayable: bool,
                 payload_store: PayloadStore | None,
                 blob_reader_ids: tuple[str, ...],
                 tracing: NodeTracing | None = None,
                 codecs: tuple[CodecChoice, ...] = (), packs: bool = False) -> None:
        self.node_name, self.channel, self.flow_type = node_name, channel, flow_type
        self.codecs = codecs
        self.packs = packs and flow_type == BATCH and not replayable
        self.replica_id, self.nb_tasks = replica_id, nb_tasks
        self.backend, self.runtime, self.payloads = backend, runtime, payloads
        self.deliveries, self.window, self.stats = deliveries, window, stats
        self.ack_wait = ack_wait
        self.replayable = replayable
        self.payload_store, self.blob_reader_ids = payload_store, blob_reader_ids
        self.tracing = tracing or NodeTracing(node_name, replica_id, channel.flow,
                                              channel.run, "", {}, tracer=False)
        # MSGID-5 live ids are {node}:{epoch}:{n}, and the node part names the node
        # replica: owner epochs are kept per replica (CTRL-4), so two replicas both
        # start at epoch 1. A ledger that dies with the process starts at 1 again after
        # every restart too, and a restarted producer's outputs would fall inside the
        # broker's duplicate window and be dropped; that owner gets an incarnation.
        self.live_id_node = f"{node_name}#{replica_id}"
        if not runtime.durable_shared():
            self.live_id_node += f"~{uuid.uuid4().hex[:12]}"
        self.source_offset = runtime.source_offset() if replayable else 0
        self._confirmed_offset = self.source_offset  # MSGID-6: the last accepted one
        self.given_offset: int | None = None  # the next output's, set by its source
        self.accepted_outputs = 0  # a replayable producer's, accepted in this process
        self._committed_offset = self.source_offset
        self._offset_committed_at = 0.0
        self._trace_prefix = uuid.uuid4().hex[:24]
        self._encoder = OutputEncoder(producer_name=node_name, flow_id=channel.flow,
                                      run_id=channel.run, replica_id=replica_id)
        # Past this size a store is cheaper than the broker (shared memory); None: only
        # what the broker refuses goes by ref.
        self._offload_above = None if payload_store is None else payload_store.offload_above
        # Frames left as pieces: a store that writes them as they are (writes_gathered)
        # copies a frame once; the others join the pieces, one copy where encoding the
        # frame into msgspec's buffer made two.
        self._encode = encode_message if payload_store is None else gather_message
        self._inline_limit: int | None = None
        self._outputs = 0
        self.group_outputs = 0
        self.event_ts: float | None = None  # set for the next output only
        self.partition_key: Any = None  # set for the next output only

    def publish(self, message: Any, metadata: dict[str, Any] | None,
                group: ReadyGroup | None, input_key: str | None,
                trace: GroupTrace | None = None) -> None:
        """Publish one output without waiting for its receipt (see
        NATSMessenger.publish_message).

        Arguments:
            message / metadata: the output; metadata may carry a checkpoint under
                CHECKPOINT_METADATA_KEY.
            group: the input group in hand, None for a producer.
            input_key: that group's key (NATSMessenger.last_input_key).
            trace: that group's trace (the header continues it); None for a producer,
                whose output starts a trace.

        Raises:
            PublicationFailed: a producer's earlier output, or this checkpointed one,
                was refused for good or still unknown at its deadline.
            DurabilityUnavailable: metadata carries a checkpoint this runtime cannot
                keep (RUN-022): nothing was published.
        """
        pending_state: bytes | None = None
        if metadata is not None and CHECKPOINT_METADATA_KEY in metadata:
            metadata = dict(metadata)
            pending_state = metadata.pop(CHECKPOINT_METADATA_KEY)
            if not isinstance(pending_state, bytes):
                raise TypeError("a checkpoint's state must be bytes, got "
                                f"{type(pending_state).__name__}")
            # Refused before anything is sent (RUN-022).
            require_durable_ledger(self.runtime, self.node_name)
            self.window.drain()  # the committed prefix is everything before, confirmed
        self._outputs += 1
        on_accepted: Callable[[Accepted], None] | None = None
        w3c_lineage = False  # trace_id is a W3C trace id as it is (tracing)
        if group is None and self.replayable:  # MSGID-6: minted from the source offset
            if self.given_offset is not None:  # the source's own (a stream sequence)
                offset, self.given_offset = self.given_offset, None
                self.source_offset = max(self.source_offset, offset)
            else:
                self.source_offset += 1
                offset = self.source_offset
            trace_id = f"{self.node_name}:src:{offset}"
            seq, msg_id = offset, trace_id
            event_ts = self.event_ts
            on_accepted = lambda _accepted: self._offset_confirmed(offset)  # noqa: E731
        elif group is None:  # a live producer: a new originating event
            # Unique without a uuid per output: this process's random prefix (96 bits)
            # and a counter; a uuid4 per frame was a quarter of a producer's time.
            trace_id, seq = f"{self._trace_prefix}{self._outputs:08x}", self._outputs
            w3c_lineage = self._outputs <= 0xFFFFFFFF  # 32 hex digits, never all zero
            msg_id = f"{self.live_id_node}:{self.runtime.epoch}:{self._outputs}"
            event_ts = self.event_ts
        else:
            trace_id, seq = group.trace_id, group.seq
            self.group_outputs += 1
            msg_id = f"{self.node_name}:{input_key}:{self.group_outputs}"
            event_ts = self.event_ts if self.event_ts is not None else group.event_ts
        partition_key, self.event_ts, self.partition_key = self.partition_key, None, None
        header = (trace_id, seq, metadata, event_ts, partition_key)
        accepted: list[Accepted] = []
        if pending_state is not None:
            on_accepted = _also(on_accepted, accepted.append)
        # With a store cheaper than the broker past some size (shared memory), the
        # message is encoded alone first: a frame then goes by ref without also being
        # encoded into an envelope thrown away, and a small message's bytes go into
        # its envelope as they are (msgspec.Raw), not encoded a second time.
        traceparent, span = self.tracing.output(trace_id, trace, msg_id, w3c_lineage)
        size = 0
        try:
            # An input passed on unchanged (a pass-through, a filter) is stored again
            # without encoding it or copying its bytes, where the store shares them.
            passed = None if self.payload_store is None else self.payloads.passed_through(
                message)
            if passed is None and self.codecs:
                message = code_message(message, self.codecs)
            blob = None if self._offload_above is None or passed is not None else (
                self._encode(message))
            if passed is not None:
                source, size = passed
                self._publish_by_ref(lambda: self.payloads.put_from(
                    source, msg_id, while_waiting=self.window.advance),
                    header, msg_id, on_accepted, traceparent)
            elif blob is not None and len(blob) > self.inline_threshold():
                size = len(blob)
                self._publish_blob(blob, header, msg_id, on_accepted, traceparent)
            else:
                data = self._encoder.encode(
                    message if blob is None else msgspec.Raw(bytes(blob)), *header)
                size = len(data)
                if not self.payloads.offloads or size <= self.inline_threshold():
                    # Small outputs may go in packs (pack=True). A live producer's go
                    # in whatever packs its publisher makes: each id is minted once, so
                    # no retry of an output needs a message alone. A processor's go in
                    # the packs its inputs' pack fixes (PublishWindow), made again alike.
                    packable = (self.packs and partition_key is None
                                and pending_state is None and size <= PACK_MEMBER_BYTES)
                    self.window.send(trusted_envelope(self.channel, data, msg_id, traceparent,
                                                      packable and group is None),
                                     self.flow_type, on_accepted=on_accepted,
                                     packable=packable and group is not None)
                else:
                    if blob is None:
                        blob = self._encode(message)
                    size = len(blob)
                    self._publish_blob(blob, header, msg_id, on_accepted, traceparent)
        finally:
            if span is not None:  # a failed send's span ends too (its error propagates)
                NodeTracing.published(span, size)
        if pending_state is not None:
            self.window.resolve_current()
            self.commit_offset(force=True)
            if accepted:
                # State and output commit together: the checkpoint names the output it
                # was taken with (RUN-022).
                self.runtime.checkpoint(pending_state, input_key or msg_id, output=msg_id)
        if group is None:  # a producer's output is a group of its own, with no inputs
            self.window.close_group()
            self.commit_offset()
        elif self.flow_type == REALTIME:
            # A REALTIME stream keeps only its newest message, so outputs that leave in
            # one burst supersede each other before any reader is handed them: a node
            # working through the inputs it took at once would otherwise send them all
            # together at its next receive. catch_up sends this one now. Not for a
            # producer: its own catch_up comes with every output already
            # (check_for_termination), batched while it is fast.
            self.backend.catch_up(at_once=True)

    def _offset_confirmed(self, offset: int) -> None:
        self._confirmed_offset = max(self._confirmed_offset, offset)
        self.accepted_outputs += 1

    def commit_offset(self, force: bool = False) -> None:
        """MSGID-6: record the last confirmed source offset in the ledger -- at most
        every OFFSET_COMMIT_SECONDS while outputs stream (a restart replays the rest,
        deduplicated by the broker), and always when forced (a checkpoint, the end)."""
        if self._confirmed_offset == self._committed_offset:
            return
        now = clock.monotonic()
        if force or now - self._offset_committed_at >= OFFSET_COMMIT_SECONDS:
            self.runtime.set_source_offset(self._confirmed_offset)
            self._committed_offset, self._offset_committed_at = self._confirmed_offset, now

    def inline_threshold(self) -> int:
        """The largest envelope that travels inline: inline_threshold of the broker's
        max_payload, or less where a store is cheaper (offload_above).

        Raises:
            PublicationFailed: the broker's max_payload is unknown.
        """
        if self._inline_limit is None:
            max_payload = self.backend.capabilities().max_payload
            if not isinstance(max_payload, Known):
                raise PublicationFailed(f"{self.node_name}: the broker's max_payload is "
                                        f"unknown ({max_payload}), so no inline limit")
            limit = inline_threshold(max_payload.value)
            cheaper = self._offload_above
            self._inline_limit = limit if cheaper is None else min(limit, cheaper)
        return self._inline_limit

    def _publish_blob(self, blob: bytes | GatheredMessage, header: _Header, msg_id: str,
                      on_accepted: Callable[[Accepted], None] | None,
                      traceparent: str | None = None) -> None:
        """_publish_by_ref of an encoded message (MessengerPayloads.put)."""
        # A full budget waits for readers' releases, and for this node's own intents,
        # which only its window resolves: it goes on resolving while it waits.
        self._publish_by_ref(
            lambda: self.payloads.put(blob, msg_id, while_waiting=self.window.advance),
            header, msg_id, on_accepted, traceparent)

    def _publish_by_ref(self, put: Callable[[], str], header: _Header, msg_id: str,
                        on_accepted: Callable[[Accepted], None] | None,
                        traceparent: str | None = None) -> None:
        """Put the message in the store (put(), returning its ref), publish the envelope
        carrying its ref, and resolve the put by the outcome: its intent released once
        accepted, the payload reclaimed at once on a definite refusal, kept (owed) while
        unknown (PAY-007/013). In the counter store (RFC 0002, BLOB-5) a refusal deletes
        it and each reader counts one read down once its settlement is confirmed."""
        if self.payload_store is not None and not self.blob_reader_ids:
            raise PublicationFailed(f"{self.node_name}: an output over the inline limit "
                                    "needs blob_reader_ids (whose reads it must outlive)")
        ref = put()
        data = self._encoder.encode(None, *header, blob_ref=ref)  # header: as publish's

        def accepted(outcome: Accepted) -> None:
            self.payloads.accepted(ref, msg_id, outcome.stream_seq)
            if on_accepted is not None:
                on_accepted(outcome)

        self.window.send(Envelope(self.channel, "data", data, msg_id, traceparent),
                         self.flow_type, on_accepted=accepted,
                         on_refused=lambda: self.payloads.refused(ref, msg_id))

    def publish_end(self, is_abort: bool, error: Any, origin: str | None = None) -> None:
        """This replica's end marker (clean, or an abort carrying error), published as
        BATCH publishes whatever the flow type, and waited for until its outcome is
        known.

        Raises:
            PublicationFailed: the marker was refused, or still unknown at its deadline.
        """
        data = end_marker(self.node_name, self.channel.flow, self.channel.run,
                          self.replica_id, self.nb_tasks, is_abort, error, origin)
        kind = "abort" if is_abort else "eos"
        msg_id = f"{self.node_name}:{kind}:{self.replica_id}"
        envelope = Envelope(self.channel, "eos", data, msg_id, self.tracing.marker(msg_id))
        published = publish_until_known(self.backend, envelope, BATCH,
                                        clock.monotonic() + self.ack_wait)
        self.stats.count(published)
        if published.dropped:
            self.deliveries.drops["publish_discarded"] += 1
            return
        if not isinstance(published.outcome, Accepted):
            raise PublicationFailed(f"{self.node_name}: {envelope.kind} {envelope.msg_id} was "
                                    f"not published: {published.outcome}",
                                    refused=isinstance(published.outcome, Rejected))


__all__ = ["OFFSET_COMMIT_SECONDS", "Outputs", "require_durable_ledger"]
