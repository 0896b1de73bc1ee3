"""NATS JetStream as a MessagingBackend: the transport under NATSMessenger.

The adapter follows the contract in videoflow.backends.messaging: it owns the
connection, its asyncio loop thread, the streams and durables it provisions, the pull
loops that prefetch deliveries into bounded per-subscription queues, the leases it
keeps alive, and the settlement of every delivery token it hands out. It knows nothing
about joining inputs, dead-letter policy, payload bytes or end-of-stream drains — those
stay in the messenger, which composes this with a payload store.

What the contract buys, concretely:

- A delivery token names the subscription, the message, the broker's attempt count and
  the subscription generation. A redelivery of the same message makes the earlier
  token stale: settling it returns SettleStale without a broker call (MSG-011).
- Settlement is confirmed or unknown, never assumed. Completed is confirmed by the
  server's reply, as ack_sync is, and reports SettleUnknown when the acknowledgement
  is not confirmed within the timeout (PAY-004). Terminal requires a durable record
  reference (DELIV-15).
- The loop runs on the thread that waits on it (broker.loop.LoopRunner): a node's
  task thread reads, parks and takes its deliveries, and sends its publications and
  settlements, itself, with no wake-up between threads; a keeper thread runs the
  loop while the task runs code of its own for longer than KEEP_SECONDS.
- Settlement and publication are pipelined (settle_async, settle_many_async,
  settle_many, publish_async): calls made between two runs of the loop go out
  together on its next run, a run of acknowledgements of one durable is confirmed by
  one request (jetstream.delivery_leases), and publications are all in flight at
  once, each Receipt filled in as its own PubAck arrives.
- Receiving costs the caller no call onto the loop: deliveries are parked by the
  inbox handler inside nats-py's read loop (jetstream.reply_inbox.subscribe_inline),
  and receive_any takes them and, while it waits, runs the loop until one is parked.
- Publication outcomes are typed (MSG-013, MSG-014); observe_publication resolves an
  unknown send by an idempotent re-publish inside the stream's duplicate window.
- Observations distinguish zero from unknown, and unresolved counts the server's
  MAX_DELIVERIES advisories and mark_exhausted (MSG-012).
- Stop-receive is separate from shutdown (RUN-030).

This module holds the class: a facade over the parts it owns, each constructed with
only the objects it needs, one module each: the Connection (jetstream.connection: the
loop, the client, riding out an outage), the Bindings registry (jetstream.bindings),
the Publisher, the Settler, the Receiver (receive_any across bindings, the byte
budget, stop-receive) and the Provisioner (streams, durables, bindings). What stays
here is the lifecycle that spans them (start, shut down, delete the run's streams)
and the observations. Below the parts: broker.loop (who runs the loop, the hand-off to
it and the fail-fast connect), jetstream.outcomes (publication outcomes),
jetstream.subscription_receiver (a binding's pull loop, owning its prefetch_queue and
its delivery_leases: settlement, and how a batch of it goes on the wire),
jetstream.reply_inbox (the connection's reply inbox), jetstream.specs (specs to
configs, answers to observations). Every NATS behaviour relied on is cited against
nats-py's source (2.15.0) and the project's checked NATS facts (NATS_FACTS).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from asyncio import AbstractEventLoop
from collections.abc import Callable, Sequence
from typing import Any

import nats.errors

from videoflow.backends.jetstream.bindings import Bindings, stop_all
from videoflow.backends.jetstream.configs import LAPSE_HOLD_SECONDS, LAPSE_SECONDS
from videoflow.backends.jetstream.connection import BROKER_CALL_SECONDS, Connection
from videoflow.backends.jetstream.provisioner import Provisioner
from videoflow.backends.jetstream.publisher import Publisher
from videoflow.backends.jetstream.receiver import Receiver
from videoflow.backends.jetstream.settler import Settler
from videoflow.backends.jetstream.specs import (
    channel_observation,
    channel_spec_for,
    durable_of,
    enum_text,
    stream_config_for_spec,
    stream_of,
    subscription_spec_for,
)
from videoflow.backends.jetstream.streams import delete_run_streams
from videoflow.backends.jetstream.subscription_receiver import (
    ACK_CONFIRM_SECONDS,
    FETCH_TIMEOUT_SECONDS,
)
from videoflow.backends.messaging import (
    LIVE_LATEST,
    RELIABLE_WORK,
    BrokerUnavailable,
    ChannelId,
    ChannelObservation,
    ChannelSpec,
    CleanupObservation,
    Delivery,
    DeliveryToken,
    Envelope,
    Known,
    LeaseObservation,
    MessagingBackend,
    MessagingCapabilities,
    PublishOutcome,
    Receipt,
    SettleOutcome,
    SettleResult,
    SubscriptionId,
    SubscriptionObservation,
    SubscriptionSpec,
    Unknown,
    VerifiedChannel,
    VerifiedSubscription,
)
from videoflow.broker.failures import unknown_from

__all__ = [
    "ACK_CONFIRM_SECONDS",
    "FETCH_TIMEOUT_SECONDS",
    "JetStreamMessagingBackend",
    "channel_spec_for",
    "stream_config_for_spec",
    "subscription_spec_for",
]


logger = logging.getLogger(__name__)


class JetStreamMessagingBackend(MessagingBackend):
    """One receiver (one process of a run) on a NATS JetStream server.

    Arguments:
        nats_url: the server, e.g. nats://localhost:4222.
        flow_id / run_id / flow_type: the run this backend serves; every channel and
            subscription it touches belongs to it.
        prefetch: per-subscription local prefetch depth (DEFAULT_PREFETCH).
        fetch_timeout: seconds one pull request waits (FETCH_TIMEOUT_SECONDS).
        ack_confirm_seconds: how long Completed waits for the broker's reply.
        keepalive: whether to extend the lease of every unsettled delivery
            periodically (ack_wait / 3).
        connect_timeout: the overall bound of start's connect, in seconds.
        byte_budget: the most envelope bytes this receiver holds unsettled — parked or
            handed out — before its pull loops pause (RUN-025; VF_PREFETCH_BYTES). A
            fetch already in flight when the budget fills still lands, so the resident
            total may exceed it by what that fetch brings. None: unbounded.

    The connection rides out a broker that goes away (restarted, frozen, a cluster
    electing a leader) for up to the outage budget — VIDEOFLOW_OUTAGE_BUDGET seconds,
    else DEFAULT_OUTAGE_BUDGET_SECONDS (60); set outage.budget before start to change
    it. Meanwhile the client reconnects, outcomes stay Unknown, and pursue_until
    extends the publication ladder's deadlines; past it the connection is closed and
    every call says why.

    The work is done by the parts it owns (connection, bindings, publisher, settler,
    receiver, provisioner): each method of the contract below the lifecycle is one
    call to the part that holds it.
    """

    def __init__(
        self,
        nats_url: str,
        flow_id: str,
        run_id: str,
        flow_type: str,
        prefetch: int = 4,
        fetch_timeout: float = 1.0,
        ack_confirm_seconds: float = 2.0,
        keepalive: bool = True,
        connect_timeout: float = 30.0,
        byte_budget: int | None = None,
    ) -> None:
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"prefetch must be an int >= 1, got {prefetch!r}")
        if byte_budget is not None and (isinstance(byte_budget, bool) or byte_budget < 1):
            raise ValueError(f"byte_budget must be None or an int >= 1, got {byte_budget!r}")
        channel_spec_for(flow_id, run_id, "node", flow_type, RELIABLE_WORK)  # validates
        self.nats_url, self.flow_id, self.run_id = nats_url, flow_id, run_id
        self.flow_type = flow_type
        self.prefetch, self.fetch_timeout = prefetch, fetch_timeout
        self.ack_confirm_seconds, self.keepalive = ack_confirm_seconds, keepalive
        self.connect_timeout, self.byte_budget = connect_timeout, byte_budget
        self.instance_id = uuid.uuid4().hex[:12]  # names this process's EOS durables
        self.connection = Connection(nats_url, connect_timeout)
        self.errors, self.outage = self.connection.errors, self.connection.outage
        self.bindings = Bindings()
        self.outage.on_back.append(self.bindings.reconnected)
        # The publisher first: a drain sends a group's outputs before any settlement
        # queued with them (settlements of a group only follow its accepted outputs).
        self.publisher = Publisher(self.connection)
        self.settler = Settler(self.connection, self.bindings, ack_confirm_seconds)
        self.receiver = Receiver(self.connection, self.bindings, prefetch, fetch_timeout,
                                 byte_budget)
        self.provisioner = Provisioner(flow_id, run_id, self.instance_id, self.connection,
                                       self.bindings, self.receiver, prefetch, fetch_timeout,
                                       ack_confirm_seconds, keepalive)

    # ------------------------------------------------------------------ lifecycle

    @property
    def connected(self) -> bool:
        return self.connection.connected

    @property
    def loop(self) -> AbstractEventLoop:
        return self.connection.runner.loop

    def pursue_until(self) -> float:
        return self.outage.pursue_until()

    def given_up(self) -> str | None:
        return self.outage.given_up

    def start(self) -> None:
        """Connect on a fresh loop and its keeper thread (LoopRunner). Idempotent.

        Raises:
            BrokerUnavailable: the server cannot be reached within connect_timeout
                (fail-fast options, NATS_FACTS S4).
        """
        if self.connection.connect():
            self.receiver.stopped = False

    def stop_receiving(self) -> int:
        """Stop admitting input on every bound subscription (Receiver.stop_receiving:
        the quiesce half of a graceful retirement, RUN-030).

        Returns:
            how many parked deliveries were handed back.
        """
        return self.receiver.stop_receiving()

    def shutdown(self, hand_back: bool = True) -> None:
        """Stop the pull loops, hand back every delivery this receiver still holds,
        flush pending publishes, close the connection, the loop and its keeper thread.

        Arguments:
            hand_back: False closes without the NAKs — what a crashed process looks
                like to the broker (its leases lapse on their own).
        """
        connection = self.connection
        if not connection.runner.running:
            return

        async def wind_down() -> None:
            receivers = self.bindings.receivers()
            await stop_all(receivers)
            for receiver in receivers:
                if hand_back:
                    await receiver.hand_back(parked_only=False)
                await receiver.unsubscribe()
            await connection.close_client()  # flushes what is still buffered

        try:
            connection.call(wind_down(), self.fetch_timeout + BROKER_CALL_SECONDS)
        except Exception as error:
            # The loop is stopped below whatever the close managed; say what it did not.
            logger.warning("jetstream backend shutdown did not complete cleanly: %r", error)
        finally:
            self.bindings.bound.clear()
            connection.forget()
            self.settler.fail_all("the backend shut down before the settlement was sent")
            self.publisher.fail_all("the backend shut down before the send")

    def close(self, owned: Sequence[ChannelId], expected_generation: str) -> CleanupObservation:
        """Delete exactly the owned channels' streams by ownership
        (topology.delete_run_streams): a stream is removed only when its owner labels
        name its run and carry expected_generation, never by name prefix. A stream
        without a generation label (as ensure_channel creates them) is not of any
        generation and is left standing. Not connected: nothing is removed and the
        observation is incomplete (re-running once connected is the remedy)."""
        client = self.connection.client
        if client is None or not self.connected:
            return CleanupObservation(removed=(), remaining=(), complete=False)
        runs: dict[tuple[str, str], list[str]] = {}
        for channel in owned:
            runs.setdefault((channel.flow, channel.run), []).append(channel.node)
        removed: list[str] = []
        remaining: list[str] = []
        complete = True
        for (flow, run), nodes in runs.items():
            try:
                result = self.connection.call(
                    delete_run_streams(client, flow, run, nodes, expected_generation),
                    BROKER_CALL_SECONDS)
            except (TimeoutError, BrokerUnavailable):
                complete = False
                continue
            removed.extend(result.removed)
            remaining.extend(result.remaining)
            complete = complete and result.complete
        return CleanupObservation(removed=tuple(removed), remaining=tuple(remaining),
                                  complete=complete and not remaining)

    def capabilities(self) -> MessagingCapabilities:
        """What this broker offers, with the parts that need a read-back reported as
        observed: max_payload from the connection, replication and storage from the
        first stream this backend provisioned (ensure_channel), and Unknown('unread')
        for either until then."""
        max_payload: Known[int] | Unknown = Unknown("unread")
        client = self.connection.client
        if self.connected and client is not None:
            max_payload = Known(client.max_payload)
        replicas: Known[int] | Unknown = Unknown("unread")
        storage: Known[str] | Unknown = Unknown("unread")
        first_stream = self.provisioner.first_stream
        if first_stream is not None:
            replicas = Known(first_stream.num_replicas or 1)
            storage = Known(enum_text(first_stream.storage or "file"))
        return MessagingCapabilities(
            backend="jetstream", profiles=frozenset({RELIABLE_WORK, LIVE_LATEST}),
            durable=True, max_payload=max_payload, replicas=replicas, storage=storage)

    # ---------------------------------------------------------------- provisioning

    def ensure_dead_letters(self, operation_id: str) -> None:
        self.provisioner.ensure_dead_letters(operation_id)

    def ensure_channel(self, spec: ChannelSpec, operation_id: str) -> VerifiedChannel:
        return self.provisioner.ensure_channel(spec, operation_id)

    def ensure_subscription(
        self, spec: SubscriptionSpec, operation_id: str
    ) -> VerifiedSubscription:
        return self.provisioner.ensure_subscription(spec, operation_id)

    def subscribe_control(self, callback: Callable[[], None]) -> None:
        self.provisioner.subscribe_control(callback)

    # ------------------------------------------------------------------ publication

    def subject_for(self, channel: ChannelId, kind: str) -> str:
        return self.publisher.subject_for(channel, kind)

    def publish_async(self, envelope: Envelope, deadline: float) -> Receipt[PublishOutcome]:
        return self.publisher.publish_async(envelope, deadline)

    def publish(self, envelope: Envelope, deadline: float) -> PublishOutcome:
        return self.publisher.publish(envelope, deadline)

    def observe_publication(self, envelope: Envelope) -> PublishOutcome:
        return self.publisher.observe_publication(envelope)

    # -------------------------------------------------------------------- receiving

    def receive_any(
        self,
        subscriptions: Sequence[SubscriptionId],
        item_credit: int,
        byte_credit: int,
        deadline: float,
    ) -> list[tuple[SubscriptionId, Delivery]]:
        return self.receiver.receive_any(subscriptions, item_credit, byte_credit, deadline)

    def catch_up(self, at_once: bool = False) -> None:
        self.receiver.catch_up(at_once)

    def set_admission(
        self,
        subscription: SubscriptionId,
        admit: Callable[[Delivery], bool],
        on_skip: Callable[[Delivery], None] | None = None,
    ) -> bool:
        return self.receiver.set_admission(subscription, admit, on_skip)

    def set_receive_depth(self, depth: int) -> None:
        self.receiver.set_receive_depth(depth)

    def prefetched(self, subscription: SubscriptionId) -> int:
        return self.receiver.prefetched(subscription)

    def skipped(self, subscription: SubscriptionId) -> int:
        return self.receiver.skipped(subscription)

    def backlog(self, subscription: SubscriptionId) -> Known[int] | Unknown:
        return self.receiver.backlog(subscription)

    def resident_bytes(self) -> int:
        return self.receiver.resident_bytes()

    def budget_waits(self) -> int:
        return self.receiver.budget_waits()

    # ------------------------------------------------------------------- settlement

    def settle_async(
        self, token: DeliveryToken, outcome: SettleOutcome, settlement_id: str
    ) -> Receipt[SettleResult]:
        return self.settler.settle_async(token, outcome, settlement_id)

    def settle_many_async(
        self, settlements: Sequence[tuple[DeliveryToken, SettleOutcome, str]]
    ) -> list[Receipt[SettleResult]]:
        return self.settler.settle_many_async(settlements)

    def settle_many(
        self, settlements: Sequence[tuple[DeliveryToken, SettleOutcome, str]]
    ) -> list[SettleResult]:
        return self.settler.settle_many(settlements)

    def settle(
        self, token: DeliveryToken, outcome: SettleOutcome, settlement_id: str
    ) -> SettleResult:
        return self.settler.settle(token, outcome, settlement_id)

    def renew(self, token: DeliveryToken) -> LeaseObservation:
        return self.settler.renew(token)

    def supersede(self, token: DeliveryToken) -> bool:
        return self.settler.supersede(token)

    def mark_exhausted(self, subscription: SubscriptionId, stream_sequence: int | None) -> None:
        self.settler.mark_exhausted(subscription, stream_sequence)

    # ---------------------------------------------------------------- observations

    def lapse_leases(self, subscription: SubscriptionId) -> bool:
        """MessagingBackend.lapse_leases: the durable's ack_wait is set to
        LAPSE_SECONDS for LAPSE_HOLD_SECONDS (the server checks its pending deliveries
        again 100 ms after a change of ack_wait), then given back, even when the wait
        was cut short. Unlike a consumer reset, what was acked is not delivered again.
        False when the durable has a delivery cap or could not be changed."""
        js = self.connection.js
        if js is None:
            return False
        stream, durable = stream_of(subscription.channel), durable_of(subscription,
                                                                      self.instance_id)

        async def lapse() -> bool:
            config = (await js.consumer_info(stream, durable)).config
            if (config.max_deliver or -1) > 0:
                return False
            ack_wait = config.ack_wait
            config.ack_wait = LAPSE_SECONDS
            try:
                await js.add_consumer(stream, config)
                await asyncio.sleep(LAPSE_HOLD_SECONDS)
            finally:
                config.ack_wait = ack_wait
                await asyncio.shield(js.add_consumer(stream, config))
            return True

        try:
            return bool(self.connection.call(lapse(),
                                             LAPSE_HOLD_SECONDS + 2 * BROKER_CALL_SECONDS))
        except (BrokerUnavailable, TimeoutError, nats.errors.Error) as error:
            # Not made to lapse now: the leases still lapse after ack_wait.
            logger.warning("could not make the leases of %s lapse: %s", durable, error)
            return False

    def _observe(self, request: Any) -> Any:
        """Run one observation request; an Unknown (never an exception) when it fails."""
        try:
            return self.connection.call(request, BROKER_CALL_SECONDS)
        except Exception as error:
            return unknown_from(error, self.errors.texts())

    def observe_channel(self, channel: ChannelId) -> Known[ChannelObservation] | Unknown:
        """stream_info().state of the channel's stream: first/last sequence, message
        count, retention."""
        js = self.connection.js
        if js is None:
            return Unknown("unreachable", "the JetStream backend is not connected")
        info = self._observe(js.stream_info(stream_of(channel)))
        if isinstance(info, Unknown):
            return info
        try:
            return Known(channel_observation(info))
        except (ValueError, AttributeError) as error:
            return Unknown("malformed", str(error))

    def observe_subscription(
        self, subscription: SubscriptionId
    ) -> Known[SubscriptionObservation] | Unknown:
        """consumer_info of the subscription's durable: available (num_pending), leased
        (num_ack_pending), unresolved (MAX_DELIVERIES advisories and mark_exhausted
        for messages still in the stream) and dropped (admission skips). Unknown when
        either the durable or its stream could not be read."""
        return self.observe_subscriptions([subscription])[0]

    def observe_subscriptions(
        self, subscriptions: Sequence[SubscriptionId]
    ) -> list[Known[SubscriptionObservation] | Unknown]:
        """observe_subscription for each, the broker asked for all of them at once: a
        join's status over nine parents was eighteen round trips one after another,
        over a quarter of its time on a loaded host. The stream is read only for a
        subscription with exhausted marks (its first sequence says which still count);
        with none, unresolved is 0 whatever the stream holds."""
        js = self.connection.js
        if js is None:
            return [Unknown("unreachable", "the JetStream backend is not connected")
                    for _ in subscriptions]
        exhausted = self.bindings.exhausted

        async def read(subscription: SubscriptionId) -> tuple[Any, int | None]:
            stream = stream_of(subscription.channel)
            info = await js.consumer_info(stream, durable_of(subscription, self.instance_id))
            if not exhausted.holds(subscription):
                return info, None
            return info, (await js.stream_info(stream)).state.first_seq

        async def read_all() -> list[Any]:
            return await asyncio.gather(*(read(s) for s in subscriptions),
                                        return_exceptions=True)

        answers = self._observe(read_all())
        if isinstance(answers, Unknown):
            return [answers for _ in subscriptions]
        return [self._subscription_observation(s, a)
                for s, a in zip(subscriptions, answers, strict=True)]

    def _subscription_observation(
        self, subscription: SubscriptionId, answer: Any
    ) -> Known[SubscriptionObservation] | Unknown:
        if isinstance(answer, BaseException):
            return unknown_from(answer, self.errors.texts())
        info, first_seq = answer
        unresolved = (0 if first_seq is None
                      else self.bindings.exhausted.count(subscription, first_seq))
        try:
            return Known(SubscriptionObservation(
                available=info.num_pending or 0, leased=info.num_ack_pending or 0,
                unresolved=unresolved, dropped=self.skipped(subscription)))
        except (ValueError, AttributeError) as error:
            return Unknown("malformed", str(error))

    def observe_ack_floor(self, subscription: SubscriptionId) -> Known[int] | Unknown:
        """consumer_info().ack_floor.stream_seq of any data durable of the run, bound
        here or not."""
        js = self.connection.js
        if js is None:
            return Unknown("unreachable", "the JetStream backend is not connected")
        info = self._observe(js.consumer_info(
            stream_of(subscription.channel), durable_of(subscription, self.instance_id)))
        if isinstance(info, Unknown):
            return info
        floor = getattr(info.ack_floor, "stream_seq", None)
        if not isinstance(floor, int):
            return Unknown("malformed", f"ack_floor {info.ack_floor!r}")
        return Known(floor)
