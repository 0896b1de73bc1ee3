"""JetStream stream and consumer configurations per flow type, and connect options."""

from __future__ import annotations

from typing import Final

from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StreamConfig,
)

from videoflow.backends.messaging_types import DLQ_RETENTION_SECONDS, DUPLICATE_WINDOW_SECONDS
from videoflow.core.constants import REALTIME, check_flow_type
from videoflow.core.credit import positive_int
from videoflow.core.naming import (
    KIND_DLQ,
    KIND_DURABLE,
    KIND_EOS_ANCHOR,
    KIND_EOS_DURABLE,
    KIND_STREAM,
    dlq_stream_name,
    dlq_subject_filter,
    durable_name_for,
    eos_anchor_durable_name_for,
    eos_durable_name_for,
    eos_subject_for,
    owner_labels,
    stream_name_for,
    subject_for,
)

DEFAULT_MAX_ACK_PENDING: Final = 8
"""A fixed broker-side max_ack_pending that does not follow the replica plan
(consumer_credit derives that, STREAM-15); kept as the reviewed value the conformance
negative controls reproduce."""

LAPSE_SECONDS: Final = 0.5
"""The ack_wait a durable holds while its leases are made to lapse: a lease cut off in
flight, or held by a dead replica, is older than that (the backend's lapse_leases, and
ops/resume.py's release_leases for a resumed run)."""

LAPSE_HOLD_SECONDS: Final = 1.0
"""How long it holds it: the server's check comes 100 ms after the change, and may be
put off while it is busy with acks."""

DEFAULT_REALTIME_BUFFER: Final = 1
"""REALTIME keeps only the freshest N messages per node and never blocks the producer (a
new publish evicts the oldest). BATCH uses INTEREST retention so acked messages are
freed, bounding the backlog to unacked messages; a full stream then rejects new
publishes (DiscardPolicy.NEW), which the publisher turns into blocking backpressure
instead of silent loss."""

DEFAULT_BATCH_MAX_MSGS: Final = 10_000
"""Unacknowledged messages a BATCH stream holds before it refuses new publishes."""

EOS_ACK_WAIT_SECONDS: Final = 30
"""ack_wait of the EOS durables: an EOS marker is acked as soon as it is seen."""

# --------------------------------------------------------------------------------------
# Stream and consumer configs
# --------------------------------------------------------------------------------------


def _num_replicas(replicas: int) -> int | None:
    # STREAM-14: 1 leaves the field to the server default, so a single-server request
    # sets no replica count (nats-py omits None fields from the request).
    positive_int("replicas", replicas)
    return replicas if replicas > 1 else None


def stream_config_for(
    flow_id: str,
    run_id: str,
    node_name: str,
    flow_type: str,
    subjects: list[str] | None = None,
    realtime_buffer: int = DEFAULT_REALTIME_BUFFER,
    batch_max_msgs: int = DEFAULT_BATCH_MAX_MSGS,
    generation: str | None = None,
    replicas: int = 1,
) -> StreamConfig:
    """The stream holding one node's output (data and EOS subjects).

    REALTIME: LIMITS retention, DiscardPolicy.OLD, and the bound per subject:
    max_msgs_per_subject = realtime_buffer (at least 1), max_msgs that times the number of
    subjects — the freshest data messages win and the producer never blocks, while the
    EOS subject keeps its own markers: a bound shared by both would let a replica's data
    evict another replica's end-of-stream marker before a late reader saw it, and that
    reader would wait for it forever. The buffer must therefore be at least the node's
    replica count (provisioning sees to it). BATCH: INTEREST retention,
    max_msgs = batch_max_msgs, DiscardPolicy.NEW — acked messages are freed and a full
    stream refuses new publishes (backpressure, not loss).

    Arguments:
        flow_id / run_id / node_name: the node's ids.
        flow_type: REALTIME or BATCH.
        subjects: the stream's subjects; None means [data subject, EOS subject].
        realtime_buffer: REALTIME backlog bound per subject: data messages kept, and
            end markers kept (one per replica of the node).
        batch_max_msgs: BATCH backlog bound.
        generation: provisioning generation recorded in the owner labels (RFC 0006);
            None leaves that label out.
        replicas: copies the stream keeps (a replicated broker profile's
            jetstream_replicas); 1 leaves the field to the server default, so a
            single-server request sets no replica count.

    Returns:
        A fresh nats.js.api.StreamConfig carrying the owner labels (STREAM-14).

    Raises:
        ValueError: an unknown flow_type, a bound or replica count below 1, or a bad name.
    """
    check_flow_type(flow_type)
    name = stream_name_for(flow_id, run_id, node_name)
    if subjects is None:
        subjects = [subject_for(flow_id, run_id, node_name),
                    eos_subject_for(flow_id, run_id, node_name)]
    else:
        subjects = list(subjects)
    # STREAM-14: owner labels and replicas on every stream.
    metadata = owner_labels(flow_id, run_id, node_name, KIND_STREAM, generation)
    num_replicas = _num_replicas(replicas)
    if flow_type == REALTIME:
        if isinstance(realtime_buffer, bool) or not isinstance(realtime_buffer, int):
            raise ValueError(f"realtime_buffer must be an int, got {realtime_buffer!r}")
        return StreamConfig(
            name=name,
            subjects=subjects,
            retention=RetentionPolicy.LIMITS,
            max_msgs_per_subject=max(1, realtime_buffer),
            max_msgs=max(1, realtime_buffer) * len(subjects),
            discard=DiscardPolicy.OLD,
            duplicate_window=DUPLICATE_WINDOW_SECONDS,
            metadata=metadata,
            num_replicas=num_replicas,
        )
    return StreamConfig(
        name=name,
        subjects=subjects,
        retention=RetentionPolicy.INTEREST,
        max_msgs=positive_int("batch_max_msgs", batch_max_msgs),
        discard=DiscardPolicy.NEW,
        duplicate_window=DUPLICATE_WINDOW_SECONDS,
        metadata=metadata,
        num_replicas=num_replicas,
    )


def dlq_stream_config(flow_id: str, replicas: int = 1) -> StreamConfig:
    """The flow's dead-letter stream (STREAM-8): every vf.{flow}._dlq.> subject, kept
    DLQ_RETENTION_SECONDS (7 days) under LIMITS retention, labelled with the flow only —
    no run id, so no run's teardown can ever own it.

    Arguments:
        flow_id (str): the flow.
        replicas (int): stream copies, as stream_config_for.

    Returns:
        A fresh nats.js.api.StreamConfig.
    """
    return StreamConfig(
        name=dlq_stream_name(flow_id),
        subjects=[dlq_subject_filter(flow_id)],
        retention=RetentionPolicy.LIMITS,
        discard=DiscardPolicy.OLD,
        max_age=float(DLQ_RETENTION_SECONDS),  # STREAM-8: a week of dead letters
        duplicate_window=DUPLICATE_WINDOW_SECONDS,
        metadata=owner_labels(flow_id, None, None, KIND_DLQ),  # STREAM-8: flow-scoped
        num_replicas=_num_replicas(replicas),
    )


def consumer_config_for(
    flow_id: str,
    run_id: str,
    consumer_node_name: str,
    parent_node_name: str,
    ack_wait: int = 60,
    max_deliver: int = 1,
    max_ack_pending: int = DEFAULT_MAX_ACK_PENDING,
    generation: str | None = None,
) -> ConsumerConfig:
    """Durable pull-consumer config for one (child, parent) edge.

    Filters to the parent's data subject so EOS markers (on the _eos subject of the
    same stream) are handled by a separate per-replica consumer instead. max_deliver is
    1 for REALTIME (no redelivery — freshest wins) and retries + 1 for BATCH (see
    max_deliver_for); max_ack_pending bounds how many un-acked messages the broker will
    hand out before it stops delivering (this is the server-side half of prefetch
    bounding). Under RFC 0006 the durable is labelled with its consuming node as owner.

    Returns:
        A fresh nats.js.api.ConsumerConfig (pull_subscribe mutates the one it is given,
        NATS_FACTS S18, so never share one between binds).
    """
    return ConsumerConfig(
        durable_name=durable_name_for(consumer_node_name, parent_node_name),
        filter_subject=subject_for(flow_id, run_id, parent_node_name),
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ack_wait,
        max_deliver=max_deliver,
        max_ack_pending=max_ack_pending,
        # STREAM-14: the consuming node owns its durable.
        metadata=owner_labels(flow_id, run_id, consumer_node_name, KIND_DURABLE, generation),
    )


def eos_consumer_config(
    flow_id: str,
    run_id: str,
    consumer_node_name: str,
    parent_node_name: str,
    instance_id: str,
    inactive_threshold: int = 3600,
    generation: str | None = None,
) -> ConsumerConfig:
    """Per-replica durable pull-consumer for a parent's EOS subject.

    inactive_threshold lets the server clean it up automatically some time after the
    flow ends, so per-process (uuid-suffixed) EOS consumers don't accumulate.

    Returns:
        A fresh nats.js.api.ConsumerConfig filtered to the parent's EOS subject.
    """
    return ConsumerConfig(
        durable_name=eos_durable_name_for(consumer_node_name, parent_node_name, instance_id),
        filter_subject=eos_subject_for(flow_id, run_id, parent_node_name),
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=EOS_ACK_WAIT_SECONDS,
        inactive_threshold=inactive_threshold,
        # STREAM-14
        metadata=owner_labels(
            flow_id, run_id, consumer_node_name, KIND_EOS_DURABLE, generation
        ),
    )


def eos_anchor_config(
    flow_id: str, run_id: str, node_name: str, generation: str | None = None
) -> ConsumerConfig:
    """Provision-time durable on a node's EOS subject that exists purely to create
    interest, so an EOS marker is retained by the BATCH (INTEREST-retention) stream no
    matter when it is published.

    The real EOS consumers are per-process (uuid-suffixed) durables created in each
    worker's setup — they cannot be pre-provisioned, so without this anchor an EOS
    published by a fast-finishing parent before a slow-starting child registers its EOS
    consumer is silently discarded (no interest at publish time), and the child then
    waits for EOS forever: the flow never terminates. The anchor is never fetched from
    and never acks, so the marker stays retained for any number of late-created
    consumers (their default DeliverPolicy.ALL replays it); the run's stream teardown
    deletes the anchor with everything else. No inactive_threshold: it must not be
    reaped while the run is alive.

    Returns:
        A fresh nats.js.api.ConsumerConfig labelled with the node that owns the stream.
    """
    return ConsumerConfig(
        durable_name=eos_anchor_durable_name_for(node_name),
        filter_subject=eos_subject_for(flow_id, run_id, node_name),
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=EOS_ACK_WAIT_SECONDS,
        metadata=owner_labels(flow_id, run_id, node_name, KIND_EOS_ANCHOR, generation),
    )


