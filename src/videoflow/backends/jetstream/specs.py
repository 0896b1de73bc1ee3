"""From the contract's specs to JetStream configurations and names, and back from
JetStream's answers (and failures, and MAX_DELIVERIES advisories) to the contract's
observations.

Nothing here talks to a broker.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from enum import Enum
from typing import Any, Final

from nats.js.api import ConsumerConfig, StreamConfig

from videoflow.backends.jetstream.configs import (
    consumer_config_for,
    eos_consumer_config,
    stream_config_for,
)
from videoflow.backends.messaging import (
    LIVE_LATEST,
    RELIABLE_WORK,
    ChannelId,
    ChannelObservation,
    ChannelSpec,
    IncompatibleProfile,
    SubscriptionId,
    SubscriptionSpec,
)
from videoflow.core.constants import BATCH, REALTIME, check_flow_type
from videoflow.core.naming import (
    eos_durable_name_for,
    partitioned_durable_name_for,
    stream_name_for,
)

ADVISORY_MAX_DELIVERIES: Final = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES"
"""Prefix of the server's max-deliveries advisory, completed by .<stream>.<durable>
(NATS_FACTS §6)."""


def channel_spec_for(
    flow_id: str,
    run_id: str,
    node: str,
    flow_type: str,
    profile: str,
    required: Sequence[SubscriptionId] = (),
    realtime_buffer: int = 1,
    batch_max_msgs: int = 10000,
    replicas: int = 1,
    max_bytes: int | None = None,
) -> ChannelSpec:
    """The channel a node's output stream must provide, from the flow type's
    stream settings, as a spec. replicas is the copies a replicated broker keeps
    (STREAM-14); max_bytes caps the stream's storage (a capacity fixture); both default
    to unset.

    Raises:
        ValueError: an unknown flow type, or a field ChannelSpec refuses.
    """
    check_flow_type(flow_type)
    return ChannelSpec(
        channel=ChannelId(flow_id, run_id, node), profile=profile, required=tuple(required),
        realtime_buffer=realtime_buffer, batch_max_msgs=batch_max_msgs, replicas=replicas,
        max_bytes=max_bytes,
    )


def _flow_type_of(spec: ChannelSpec) -> str:
    if spec.profile == RELIABLE_WORK:
        return BATCH
    if spec.profile == LIVE_LATEST:
        return REALTIME
    raise IncompatibleProfile(
        f"JetStream cannot promise {spec.profile!r} for {spec.channel.node!r}: only "
        "reliable_work and live_latest are stream-level profiles",
        channel=spec.channel.node, profile=spec.profile,
        findings=(f"profile: {spec.profile} is not a stream-level profile",),
    )


def stream_config_for_spec(spec: ChannelSpec, generation: str | None = None) -> StreamConfig:
    """The JetStream StreamConfig a channel spec means — for a default spec,
    byte-identical to the flow type's (configs.stream_config_for): reliable_work is the
    BATCH stream (INTEREST, DiscardPolicy.NEW at batch_max_msgs), live_latest the
    REALTIME one (LIMITS, DiscardPolicy.OLD at realtime_buffer per subject);
    max_bytes, when set, is added to either.

    Raises:
        IncompatibleProfile: a profile that is not a stream-level promise.
    """
    channel = spec.channel
    config = stream_config_for(
        channel.flow, channel.run, channel.node, _flow_type_of(spec),
        realtime_buffer=spec.realtime_buffer, batch_max_msgs=spec.batch_max_msgs,
        generation=generation, replicas=spec.replicas,
    )
    if spec.max_bytes is not None:
        config = config.evolve(max_bytes=spec.max_bytes)
    return config


def subscription_spec_for(
    subscription: SubscriptionId,
    ack_wait_seconds: float,
    max_deliver: int,
    credit: int,
    byte_credit: int = 0,
) -> SubscriptionSpec:
    """A subscription spec: credit is the broker-side max_ack_pending this subscription
    is bound with."""
    return SubscriptionSpec(id=subscription, ack_wait_seconds=ack_wait_seconds,
                            max_deliver=max_deliver, credit=credit, byte_credit=byte_credit)


def stream_of(channel: ChannelId) -> str:
    """The stream holding a channel."""
    return stream_name_for(channel.flow, channel.run, channel.node)


def durable_of(subscription: SubscriptionId, instance_id: str) -> str:
    """The durable a subscription binds: the shared data durable, a partitioned
    replica's own, or this process's EOS durable (one per consuming replica)."""
    parent = subscription.channel.node
    if subscription.kind == "eos":
        return eos_durable_name_for(subscription.consumer, parent, instance_id)
    config = consumer_config_for(subscription.channel.flow, subscription.channel.run,
                                 subscription.consumer, parent)
    assert config.durable_name is not None
    if subscription.replica is None:
        return config.durable_name
    return partitioned_durable_name_for(subscription.consumer, parent, subscription.replica)


def consumer_config_for_spec(spec: SubscriptionSpec, instance_id: str) -> ConsumerConfig:
    """The durable a subscription spec means, byte-identical to the flow type's: a
    data durable is consumer_config_for with the spec's ack_wait, max_deliver and
    credit as max_ack_pending (MSG-017); an EOS durable is eos_consumer_config as it is
    (its ack_wait and unbounded credit are fixed by design)."""
    sub, channel = spec.id, spec.id.channel
    if sub.kind == "eos":
        return eos_consumer_config(channel.flow, channel.run, sub.consumer, channel.node,
                                   instance_id)
    config = consumer_config_for(
        channel.flow, channel.run, sub.consumer, channel.node,
        ack_wait=spec.ack_wait_seconds,  # type: ignore[arg-type]  # seconds; ns on the wire
        max_deliver=spec.max_deliver, max_ack_pending=spec.credit,
    )
    if sub.replica is not None:
        name = durable_of(sub, instance_id)
        config = config.evolve(durable_name=name)
    return config


def enum_text(value: Any) -> str:
    """A config enum as its wire text: stream_info answers plain str (NATS_FACTS S17)."""
    return str(value.value if isinstance(value, Enum) else value)


def channel_observation(info: Any) -> ChannelObservation:
    """stream_info's state as a ChannelObservation."""
    state = info.state
    return ChannelObservation(first_seq=state.first_seq, last_seq=state.last_seq,
                              messages=state.messages,
                              retention=enum_text(info.config.retention or "limits"))


class ExhaustedMarks:
    """Messages a subscription's broker retains but will never resolve (MSG-012): the
    stream sequences its MAX_DELIVERIES advisories named, those mark_exhausted named,
    and a count of anonymous marks (the ledger did not know the sequence). Written from
    the loop thread (advisories) and the caller's (marks, settlements), hence the lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seqs: dict[SubscriptionId, set[int]] = {}
        self._anonymous: dict[SubscriptionId, int] = {}

    def mark(self, subscription: SubscriptionId, seq: int | None) -> None:
        with self._lock:
            if seq is None:
                self._anonymous[subscription] = self._anonymous.get(subscription, 0) + 1
            else:
                self._seqs.setdefault(subscription, set()).add(seq)

    def mark_advisory(self, subscription: SubscriptionId, data: bytes) -> None:
        """Record a MAX_DELIVERIES advisory's stream_seq (NATS_FACTS §6); an advisory
        that cannot be read is ignored."""
        try:
            seq = int(json.loads(data)["stream_seq"])
        except (ValueError, KeyError, TypeError):
            return
        self.mark(subscription, seq)

    def clear(self, subscription: SubscriptionId, seq: int) -> None:
        """A Terminal settlement of seq: its mark, or else one anonymous mark, goes."""
        with self._lock:
            marked = self._seqs.get(subscription, set())
            if seq in marked:
                marked.discard(seq)
            elif self._anonymous.get(subscription, 0) > 0:
                self._anonymous[subscription] -= 1

    def holds(self, subscription: SubscriptionId) -> bool:
        """Whether any mark of subscription's is kept (else count is 0 for any
        first_seq)."""
        with self._lock:
            return bool(self._seqs.get(subscription)) or self._anonymous.get(subscription, 0) > 0

    def count(self, subscription: SubscriptionId, first_seq: int) -> int:
        """Marks still unresolved; a marked message below the stream's first_seq left
        the stream and is forgotten."""
        with self._lock:
            kept = {s for s in self._seqs.get(subscription, set()) if s >= first_seq}
            self._seqs[subscription] = kept
            return len(kept) + self._anonymous.get(subscription, 0)


__all__ = [
    "ExhaustedMarks",
    "ADVISORY_MAX_DELIVERIES",
    "channel_observation",
    "channel_spec_for",
    "consumer_config_for_spec",
    "durable_of",
    "enum_text",
    "stream_config_for_spec",
    "stream_of",
    "subscription_spec_for",
]
