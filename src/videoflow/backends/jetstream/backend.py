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
  one request (jetstream.settle), and publications are all in flight at once, each
  Receipt filled in as its own PubAck arrives.
- Receiving costs the caller no call onto the loop: deliveries are parked by the
  inbox handler inside nats-py's read loop (jetstream.settle.subscribe_inline), and
  receive_any takes them and, while it waits, runs the loop until one is parked.
- Publication outcomes are typed (MSG-013, MSG-014); observe_publication resolves an
  unknown send by an idempotent re-publish inside the stream's duplicate window.
- Observations distinguish zero from unknown, and unresolved counts the server's
  MAX_DELIVERIES advisories and mark_exhausted (MSG-012).
- Stop-receive is separate from shutdown (RUN-030).

This module holds the class, its connection's lifecycle (connect, ride out an
outage, quiesce, shut down, delete the run's streams) and its observations. The class
is composed of parts, one module each, that share the state backend_state declares:
backend_provisioning (streams, durables, bindings), backend_publishing,
backend_receiving (receive_any across bindings, the byte budget) and
backend_settlement. The pieces below them live beside this module too: broker.loop
(who runs the loop, the hand-off to it and the fail-fast connect), jetstream.outcomes
(publication outcomes), jetstream.receive (a binding's pull loop, its queue and its
settlement), jetstream.settle (the reply inbox and how a batch of settlements goes on
the wire), jetstream.specs (specs to configs, answers to observations). Every NATS
behaviour relied on is cited against nats-py's source (2.15.0) and the project's
checked NATS facts (NATS_FACTS).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from asyncio import AbstractEventLoop
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext

from videoflow.backends.jetstream.backend_provisioning import BackendProvisioning
from videoflow.backends.jetstream.backend_publishing import BackendPublishing
from videoflow.backends.jetstream.backend_receiving import BackendReceiving
from videoflow.backends.jetstream.backend_settlement import BackendSettlement
from videoflow.backends.jetstream.backend_state import (
    BROKER_CALL_SECONDS,
    CALL_MARGIN_SECONDS,
    Binding,
    QueuedPublication,
    QueuedSettlement,
    resolve_publications,
    resolve_settlements,
)
from videoflow.backends.jetstream.outcomes import PublicationLedger
from videoflow.backends.jetstream.reply_inbox import ReplyMux
from videoflow.backends.jetstream.specs import (
    ExhaustedMarks,
    channel_observation,
    channel_spec_for,
    consumer_credit,
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
    SubscriptionReceiver,
)
from videoflow.backends.messaging import (
    LIVE_LATEST,
    RELIABLE_WORK,
    BrokerUnavailable,
    ChannelId,
    ChannelObservation,
    CleanupObservation,
    Delivery,
    Known,
    MessagingBackend,
    MessagingCapabilities,
    Rejected,
    SettleUnknown,
    SubscriptionId,
    SubscriptionObservation,
    Unknown,
)
from videoflow.broker.failures import unknown_from
from videoflow.broker.link import (
    Outage,
    broker_known_from_env,
    outage_budget_from_env,
    redact_url,
    retry_until,
    transient,
    wait_back,
)
from videoflow.broker.loop import (
    ErrorLog,
    Handoff,
    LoopRunner,
    LoopWake,
    close_client,
    connect_fail_fast,
)

__all__ = [
    "ACK_CONFIRM_SECONDS",
    "FETCH_TIMEOUT_SECONDS",
    "JetStreamMessagingBackend",
    "channel_spec_for",
    "consumer_credit",
    "stream_config_for_spec",
    "subscription_spec_for",
]


logger = logging.getLogger(__name__)


async def _stop_all(receivers: list[SubscriptionReceiver]) -> None:
    """Stop every pull loop at once: each withdraws its inbox with a round trip of its
    own, which one after another a node with many parents would pay per subscription."""
    await asyncio.gather(*(receiver.stop() for receiver in receivers))


class JetStreamMessagingBackend(BackendProvisioning, BackendPublishing, BackendReceiving,
                                BackendSettlement, MessagingBackend):
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
        self.errors = ErrorLog()
        self.outage = Outage(outage_budget_from_env(), where=nats_url,
                             known=broker_known_from_env(), what="the messaging connection")
        self.outage.on_back.append(self._reconnected)
        self._runner = LoopRunner()
        self._client: Client | None = None
        self._js: JetStreamContext | None = None
        self._bindings: dict[SubscriptionId, Binding] = {}
        self._generations: dict[SubscriptionId, int] = {}
        self._admission: dict[SubscriptionId, tuple[Callable[[Delivery], bool],
                                                    Callable[[Delivery], None] | None]] = {}
        self._exhausted = ExhaustedMarks()
        self._ledger = PublicationLedger()
        self._first_stream: Any = None
        self._stopped_receiving = False
        self._retired_budget_waits = 0
        wake = LoopWake(self._runner)
        # Publications first: a drain sends a group's outputs before any settlement
        # queued with them (settlements of a group only follow its accepted outputs).
        self._publications: Handoff[QueuedPublication] = Handoff(
            wake, self._drain_publications,
            lambda queued, reason: resolve_publications(
                queued, Rejected(f"nothing was sent: {reason}", retryable=True)))
        self._settlements: Handoff[QueuedSettlement] = Handoff(
            wake, self._drain_settlements,
            lambda queued, reason: resolve_settlements(queued, SettleUnknown(reason)))
        self._pipelined: set[asyncio.Task[None]] = set()
        self._subjects: dict[tuple[ChannelId, str], str] = {}
        self._wanted = prefetch  # set_receive_depth
        self._replies: ReplyMux | None = None
        self._send_lock: asyncio.Lock | None = None
        # Rung on the loop by every binding as it parks a delivery; receive_any waits
        # on it only while another thread runs the loop (it runs the loop otherwise).
        self._arrivals = threading.Condition(threading.Lock())
        self._arrived = 0
        self._ring_scheduled = False

    # ------------------------------------------------------------------ lifecycle

    def _call(self, coro: Any, timeout: float) -> Any:
        return self._runner.run(coro, timeout + CALL_MARGIN_SECONDS)

    def _ride(self, make: Callable[[JetStreamContext], Coroutine[Any, Any, Any]]) -> Any:
        """make(js)'s idempotent request (a stream, a durable, read back), made again
        while it fails transiently or the broker is away: a replica starting while a
        cluster elects a stream's leader, or while its broker restarts, waits for it
        (broker.link.retry_until) instead of dying on its first timeout.

        Raises:
            BrokerUnavailable: not connected once retry_until passed, or the
                connection was given up.
            the request's error: any that is not transient, or the last one once
                retry_until passed.
        """
        started = time.monotonic()
        while True:
            try:
                _, js = self._require()
                return self._call(make(js), BROKER_CALL_SECONDS)
            except (BrokerUnavailable, TimeoutError, nats.errors.Error) as error:
                away = isinstance(error, BrokerUnavailable)
                until = retry_until(self.outage, started)
                if (self._client is None or not (away or transient(error))
                        or time.monotonic() >= until):
                    raise
                wait_back(self._client, self.outage, until)

    def _require(self) -> tuple[Client, JetStreamContext]:
        if self._client is None or self._js is None or not self._client.is_connected:
            raise BrokerUnavailable(self._not_connected())
        return self._client, self._js

    def _not_connected(self) -> str:
        """Why nothing can be sent now, in words an operator can act on."""
        if self.outage.given_up is not None:
            return self.outage.given_up
        if self.outage.away:
            return (f"the broker {redact_url(self.nats_url)} is away (reconnecting for up to "
                    f"{self.outage.budget:g} s)")
        return "the JetStream backend is not connected"

    def _reconnected(self) -> None:
        """The broker is back: the pull requests open before the outage died with the
        old connection, so every binding asks again at once."""
        for binding in list(self._bindings.values()):
            binding.receiver.reconnected()

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
        if self._client is not None:
            return
        self._runner.start()
        try:
            client = self._call(
                connect_fail_fast(self.nats_url, self.connect_timeout, self.errors,
                                  self.outage),
                self.outage.first_connect_bound(self.connect_timeout))
        except BaseException:
            self._runner.stop()
            raise
        self._client, self._js = client, client.jetstream()
        self._replies = ReplyMux(client)  # one reply inbox for settlements and receipts
        self._send_lock = asyncio.Lock()
        self._stopped_receiving = False

    @property
    def loop(self) -> AbstractEventLoop:
        return self._runner.loop

    def stop_receiving(self) -> int:
        """Stop admitting input on every bound subscription — the quiesce half of a
        graceful retirement (RUN-030): the pull loops fetch nothing more, and every
        delivery parked in a prefetch queue is NAKed back to the broker at once. The
        deliveries already handed out stay this receiver's to settle. Idempotent; a
        second call hands back nothing more.

        Returns:
            how many parked deliveries were handed back.
        """
        self._stopped_receiving = True
        if not self._runner.running or not self._bindings:
            return 0

        async def quiesce() -> int:
            receivers = [binding.receiver for binding in self._bindings.values()]
            await _stop_all(receivers)
            handed = 0
            for receiver in receivers:
                handed += await receiver.hand_back(parked_only=True)
            return handed

        return int(self._call(quiesce(), self.fetch_timeout + BROKER_CALL_SECONDS))

    def shutdown(self, hand_back: bool = True) -> None:
        """Stop the pull loops, hand back every delivery this receiver still holds,
        flush pending publishes, close the connection, the loop and its keeper thread.

        Arguments:
            hand_back: False closes without the NAKs — what a crashed process looks
                like to the broker (its leases lapse on their own).
        """
        if not self._runner.running:
            return

        async def wind_down() -> None:
            receivers = [binding.receiver for binding in self._bindings.values()]
            await _stop_all(receivers)
            for receiver in receivers:
                if hand_back:
                    await receiver.hand_back(parked_only=False)
                await receiver.unsubscribe()
            if self._client is not None:
                await close_client(self._client)  # flushes what is still buffered

        try:
            self._call(wind_down(), self.fetch_timeout + BROKER_CALL_SECONDS)
        except Exception as error:
            # The loop is stopped below whatever the close managed; say what it did not.
            logger.warning("jetstream backend shutdown did not complete cleanly: %r", error)
        finally:
            self._bindings.clear()
            self._client, self._js = None, None
            self._runner.stop()
            self._settlements.fail_all("the backend shut down before the settlement was sent")
            self._publications.fail_all("the backend shut down before the send")

    def close(self, owned: Sequence[ChannelId], expected_generation: str) -> CleanupObservation:
        """Delete exactly the owned channels' streams by ownership
        (topology.delete_run_streams): a stream is removed only when its owner labels
        name its run and carry expected_generation, never by name prefix. A stream
        without a generation label (as ensure_channel creates them) is not of any
        generation and is left standing. Not connected: nothing is removed and the
        observation is incomplete (re-running once connected is the remedy)."""
        if self._client is None or not self.connected:
            return CleanupObservation(removed=(), remaining=(), complete=False)
        client = self._client
        runs: dict[tuple[str, str], list[str]] = {}
        for channel in owned:
            runs.setdefault((channel.flow, channel.run), []).append(channel.node)
        removed: list[str] = []
        remaining: list[str] = []
        complete = True
        for (flow, run), nodes in runs.items():
            try:
                result = self._call(
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
        if self.connected and self._client is not None:
            max_payload = Known(self._client.max_payload)
        replicas: Known[int] | Unknown = Unknown("unread")
        storage: Known[str] | Unknown = Unknown("unread")
        if self._first_stream is not None:
            replicas = Known(self._first_stream.num_replicas or 1)
            storage = Known(enum_text(self._first_stream.storage or "file"))
        return MessagingCapabilities(
            backend="jetstream", profiles=frozenset({RELIABLE_WORK, LIVE_LATEST}),
            durable=True, max_payload=max_payload, replicas=replicas, storage=storage)

    # ---------------------------------------------------------------- observations

    def _observe(self, request: Any) -> Any:
        """Run one observation request; an Unknown (never an exception) when it fails."""
        try:
            return self._call(request, BROKER_CALL_SECONDS)
        except Exception as error:
            return unknown_from(error, self.errors.texts())

    def observe_channel(self, channel: ChannelId) -> Known[ChannelObservation] | Unknown:
        """stream_info().state of the channel's stream: first/last sequence, message
        count, retention."""
        if self._js is None:
            return Unknown("unreachable", "the JetStream backend is not connected")
        info = self._observe(self._js.stream_info(stream_of(channel)))
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
        if self._js is None:
            return [Unknown("unreachable", "the JetStream backend is not connected")
                    for _ in subscriptions]
        js = self._js

        async def read(subscription: SubscriptionId) -> tuple[Any, int | None]:
            stream = stream_of(subscription.channel)
            info = await js.consumer_info(stream, durable_of(subscription, self.instance_id))
            if not self._exhausted.holds(subscription):
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
        unresolved = 0 if first_seq is None else self._exhausted.count(subscription, first_seq)
        try:
            return Known(SubscriptionObservation(
                available=info.num_pending or 0, leased=info.num_ack_pending or 0,
                unresolved=unresolved, dropped=self.skipped(subscription)))
        except (ValueError, AttributeError) as error:
            return Unknown("malformed", str(error))

    def observe_ack_floor(self, subscription: SubscriptionId) -> Known[int] | Unknown:
        """consumer_info().ack_floor.stream_seq of any data durable of the run, bound
        here or not."""
        if self._js is None:
            return Unknown("unreachable", "the JetStream backend is not connected")
        info = self._observe(self._js.consumer_info(
            stream_of(subscription.channel), durable_of(subscription, self.instance_id)))
        if isinstance(info, Unknown):
            return info
        floor = getattr(info.ack_floor, "stream_seq", None)
        if not isinstance(floor, int):
            return Unknown("malformed", f"ack_floor {info.ack_floor!r}")
        return Known(floor)
