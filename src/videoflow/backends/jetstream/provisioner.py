"""Provisioning and binding on JetStream: Provisioner, the part of
JetStreamMessagingBackend that creates or reconciles the run's streams (its channels
and the flow's dead letters), binds each subscription's durable to a receiver of its
own (rebinding with the next generation, MSG-011) with its MAX_DELIVERIES advisory
(MSG-012), and subscribes to the run's control subject.

Also here, the coroutines it runs on the loop for a channel's stream and a
subscription's durable, created or reconciled and read back, with whether the call
created them (ensure_channel_stream, ensure_durable); the idempotent
create-with-read-back itself is jetstream.streams' (ensure_stream, ensure_consumer),
shared with a whole flow's provisioning (jetstream.flow_provisioning).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, StreamConfig

from videoflow.backends.jetstream.bindings import Binding, Bindings
from videoflow.backends.jetstream.configs import dlq_stream_config
from videoflow.backends.jetstream.connection import BROKER_CALL_SECONDS, Connection
from videoflow.backends.jetstream.receiver import Receiver
from videoflow.backends.jetstream.specs import (
    ADVISORY_MAX_DELIVERIES,
    consumer_config_for_spec,
    durable_of,
    stream_config_for_spec,
    stream_of,
)
from videoflow.backends.jetstream.streams import ensure_consumer, ensure_stream
from videoflow.backends.jetstream.subscription_receiver import SubscriptionReceiver, bind_receiver
from videoflow.backends.jetstream.verification import (
    VerifiedConsumer,
    VerifiedStream,
    profile_mismatches,
)
from videoflow.backends.messaging import (
    BrokerUnavailable,
    ChannelSpec,
    IncompatibleProfile,
    SubscriptionId,
    SubscriptionSpec,
    UnobservableState,
    VerifiedChannel,
    VerifiedSubscription,
)
from videoflow.broker.failures import JSErrorCode
from videoflow.broker.loop import registered
from videoflow.core.naming import control_subject_for


def channel_findings(spec: ChannelSpec, effective: StreamConfig) -> list[str]:
    """The immutable ways a stream contradicts its spec: the profile's retention and
    discard (profile_mismatches) and the replica count."""
    findings = list(profile_mismatches(spec.profile, effective))
    if (effective.num_replicas or 1) != spec.replicas:
        findings.append(f"num_replicas: {effective.num_replicas} (requested {spec.replicas})")
    return findings


async def ensure_channel_stream(
    js: JetStreamContext, spec: ChannelSpec
) -> tuple[bool, VerifiedStream]:
    """Create or reconcile a channel's stream (stream_config_for_spec) and read it back.

    Returns:
        (created, verified): created is whether the stream was missing before this
        call; verified.effective is None when the read-back failed.

    Raises:
        IncompatibleProfile: a profile JetStream cannot promise, replicas the server
            cannot keep (REPLICAS_UNSUPPORTED), or an existing stream whose retention, discard or
            replicas contradict the spec (an update the broker refused).
        nats.js.errors.APIError and connection errors: the broker refused otherwise or
            did not answer.
    """
    config = stream_config_for_spec(spec)
    name = stream_of(spec.channel)
    try:
        await js.stream_info(name)
        created = False
    except nats.js.errors.NotFoundError as error:
        if error.err_code != JSErrorCode.STREAM_NOT_FOUND:
            raise
        created = True
    try:
        verified = await ensure_stream(js, config)
    except nats.js.errors.APIError as error:
        if error.err_code != JSErrorCode.REPLICAS_UNSUPPORTED:
            raise
        raise IncompatibleProfile(
            f"{name}: {error.description}", channel=spec.channel.node, profile=spec.profile,
            findings=(f"num_replicas: {spec.replicas} ({error.description})",),
        ) from error
    if verified.effective is not None:
        findings = channel_findings(spec, verified.effective)
        if findings:
            raise IncompatibleProfile(
                f"{name} does not carry {spec.profile}: {'; '.join(findings)}",
                channel=spec.channel.node, profile=spec.profile, findings=findings)
    return created, verified


async def ensure_durable(
    js: JetStreamContext, stream: str, durable: str, config: ConsumerConfig
) -> tuple[bool, VerifiedConsumer]:
    """Create or update a durable with add_consumer (never pull_subscribe, which binds
    an existing durable and ignores the config, NATS_FACTS S5) and read it back.

    Returns:
        (created, verified): created is whether the durable was missing before.

    Raises:
        nats.js.errors.NotFoundError: the stream does not exist (STREAM_NOT_FOUND).
    """
    try:
        await js.consumer_info(stream, durable)
        created = False
    except nats.js.errors.NotFoundError as error:
        if error.err_code == JSErrorCode.STREAM_NOT_FOUND:
            raise
        created = True
    return created, await ensure_consumer(js, stream, config)


class Provisioner:
    """The run's streams and durables, and the bindings that receive from them
    (ensure_dead_letters, ensure_channel, ensure_subscription, subscribe_control).

    Arguments:
        flow_id / run_id: the run provisioned.
        instance_id: names this process's EOS durables.
        connection: the connection the requests are made on.
        bindings: where each binding made is kept.
        receiver: what every binding parks for (its ring, byte budget, receive depth
            and whether receiving has stopped).
        prefetch / fetch_timeout / ack_confirm_seconds / keepalive: each binding's, as
            JetStreamMessagingBackend takes them.

    Attributes:
        first_stream: the effective configuration of the first stream ensure_channel
            read back (capabilities reports its replicas and storage); None before.
    """

    def __init__(self, flow_id: str, run_id: str, instance_id: str, connection: Connection,
                 bindings: Bindings, receiver: Receiver, prefetch: int, fetch_timeout: float,
                 ack_confirm_seconds: float, keepalive: bool) -> None:
        self.flow_id, self.run_id, self.instance_id = flow_id, run_id, instance_id
        self.connection, self.bindings, self.receiver = connection, bindings, receiver
        self.prefetch, self.fetch_timeout = prefetch, fetch_timeout
        self.ack_confirm_seconds, self.keepalive = ack_confirm_seconds, keepalive
        self.first_stream: Any = None

    def ensure_dead_letters(self, operation_id: str) -> None:
        """Create (or find, read back, unchanged) the flow's dead-letter stream
        (dlq_stream_config: LIMITS, a week's max_age, flow-level owner labels, STREAM-8).
        Idempotent, so operation_id needs no bookkeeping.

        Raises:
            BrokerUnavailable: not connected, or the broker did not answer.
        """
        try:
            self.connection.ride(lambda js: ensure_stream(js, dlq_stream_config(self.flow_id)))
        except (TimeoutError, nats.errors.Error) as error:
            raise BrokerUnavailable(f"ensure_dead_letters for {self.flow_id}: {error}") from error

    def ensure_channel(self, spec: ChannelSpec, operation_id: str) -> VerifiedChannel:
        """Create or reconcile the channel and read back its effective configuration.
        An immutable mismatch (retention, replicas) raises IncompatibleProfile;
        "already exists" is never accepted without inspection. Naturally idempotent
        (add_stream of an identical config is a no-op), so operation_id needs no
        bookkeeping.

        Raises:
            IncompatibleProfile: a profile JetStream cannot promise, replicas the server
                cannot keep (REPLICAS_UNSUPPORTED), or a stream whose retention or
                replicas contradict the spec.
            BrokerUnavailable: not connected, or the broker did not answer.
        """
        name = stream_of(spec.channel)
        try:
            created, verified = self.connection.ride(lambda js: ensure_channel_stream(js, spec))
        except nats.js.errors.APIError as error:
            raise BrokerUnavailable(f"ensure_channel {name}: {error}",
                                    code=error.err_code) from error
        except (TimeoutError, nats.errors.Error) as error:
            raise BrokerUnavailable(f"ensure_channel {name}: {error}") from error
        if verified.effective is None:
            raise BrokerUnavailable(f"ensure_channel {name}: {verified.mismatches[0]}")
        if self.first_stream is None:
            self.first_stream = verified.effective
        return VerifiedChannel(spec=spec, name=name, created=created,
                               mismatches=verified.mismatches)

    def ensure_subscription(
        self, spec: SubscriptionSpec, operation_id: str
    ) -> VerifiedSubscription:
        """Bind the subscription's durable (creating it when absent, from the config
        its spec means), read it back, and start prefetching into its queue.
        A data subscription also subscribes to the broker's MAX_DELIVERIES advisory for
        its durable, which feeds unresolved (MSG-012). Repeating the same operation_id
        returns the same binding; a new one rebinds with the next generation, handing
        the old binding's parked deliveries back and making its tokens stale (MSG-011).

        Raises:
            UnobservableState: the channel's stream does not exist (reason 'missing').
            BrokerUnavailable: not connected, or the broker did not answer.
        """
        bindings, receiving = self.bindings, self.receiver
        old = bindings.bound.get(spec.id)
        if old is not None and old.operation_id == operation_id:
            return old.verified
        stream = stream_of(spec.id.channel)
        durable = durable_of(spec.id, self.instance_id)
        config = consumer_config_for_spec(spec, self.instance_id)
        generation = bindings.generations.get(spec.id, -1) + 1
        admit, on_skip = bindings.admission.get(spec.id, (None, None))

        try:
            created, verified = self.connection.ride(
                lambda js: ensure_durable(js, stream, durable, config))
        except nats.js.errors.NotFoundError as error:
            raise UnobservableState(f"no stream {stream} to bind {durable} to",
                                    reason="missing", detail=str(error)) from error
        except (TimeoutError, nats.errors.Error) as error:
            raise BrokerUnavailable(f"ensure_subscription {durable}: {error}") from error
        client, _ = self.connection.require()

        async def bind() -> tuple[SubscriptionReceiver, Any]:
            if old is not None:
                await old.receiver.stop()
                await old.receiver.hand_back(parked_only=True)
                await old.receiver.unsubscribe()
                if old.advisory is not None:
                    await old.advisory.unsubscribe()
            receiver = await bind_receiver(
                client, spec.id, stream, durable, generation, prefetch=self.prefetch,
                fetch_timeout=self.fetch_timeout,
                ack_confirm_seconds=self.ack_confirm_seconds, byte_credit=spec.byte_credit,
                may_fetch=None if receiving.byte_budget is None else receiving.budget_admits,
                admit=admit, on_skip=on_skip,
                replies=self.connection.replies, on_parked=receiving.ring)
            receiver.wanted = receiving.wanted  # before its pull loop's first request
            receiver.schedule = self.connection.runner.call_soon
            if self.keepalive:
                receiver.leases.keep_alive(spec.ack_wait_seconds / 3)
            advisory = None
            if spec.id.kind == "data":
                advisory = await client.subscribe(
                    f"{ADVISORY_MAX_DELIVERIES}.{stream}.{durable}",
                    cb=self._advisory_handler(spec.id))
            return receiver, advisory

        try:
            receiver, advisory = self.connection.call(bind(), BROKER_CALL_SECONDS)
        except (TimeoutError, nats.errors.Error) as error:
            raise BrokerUnavailable(f"ensure_subscription {durable}: {error}") from error
        if old is not None:
            bindings.retired_budget_waits += old.receiver.budget_waits
        bindings.generations[spec.id] = generation
        result = VerifiedSubscription(spec=spec, name=durable, generation=generation,
                                      created=created, mismatches=verified.mismatches)
        binding = Binding(spec, result, operation_id, stream, receiver)
        binding.advisory = advisory
        bindings.bound[spec.id] = binding
        if receiving.stopped:
            self.connection.call(receiver.stop(), self.fetch_timeout + BROKER_CALL_SECONDS)
        return result

    def _advisory_handler(self, subscription: SubscriptionId) -> Callable[[Msg], Any]:
        async def on_advisory(msg: Msg) -> None:
            # S11: fires on the next pull after the last delivery, carrying stream_seq.
            self.bindings.exhausted.mark_advisory(subscription, msg.data)

        return on_advisory

    def subscribe_control(self, callback: Callable[[], None]) -> None:
        """Invoke callback (on the loop, whichever thread runs it) when the run's
        flow-wide stop is published (core NATS, vf.{flow}.{run}._control.stop)."""
        client, _ = self.connection.require()

        async def on_stop(_msg: Msg) -> None:
            callback()

        async def subscribe() -> None:
            await client.subscribe(control_subject_for(self.flow_id, self.run_id), cb=on_stop)
            # SUB is fire-and-forget: once the server has it, a stop published after
            # this returns is never missed.
            await registered(client, BROKER_CALL_SECONDS)

        self.connection.call(subscribe(), BROKER_CALL_SECONDS)


__all__ = ["Provisioner", "channel_findings", "ensure_channel_stream", "ensure_durable"]
