"""NATS JetStream as a MessagingBackend — the transport half of what NATSMessenger used
to be all of.

The split follows the contract in videoflow.backends.messaging: this adapter owns the
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

The pieces live beside this module: broker.loop (who runs the loop, the hand-off to
it and the fail-fast connect), jetstream.outcomes (publication outcomes),
jetstream.receive (pull loops and settlement), jetstream.settle (the reply inbox and
how a batch of settlements goes on the wire), jetstream.specs (specs to configs,
answers to observations). Every NATS
behaviour relied on is cited against nats-py 2.15.0 and /work/shared/design/NATS_FACTS.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
import uuid
from asyncio import AbstractEventLoop
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Final

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from videoflow.backends.jetstream.configs import dlq_stream_config
from videoflow.backends.jetstream.durables import ensure_channel_stream, ensure_durable
from videoflow.backends.jetstream.outcomes import (
    PublicationLedger,
    observe_by_republish,
    publish_pipelined,
)
from videoflow.backends.jetstream.receive import (
    ACK_CONFIRM_SECONDS,
    FETCH_TIMEOUT_SECONDS,
    SubscriptionReceiver,
    bind_receiver,
    take_round_robin,
)
from videoflow.backends.jetstream.settle import ReplyMux
from videoflow.backends.jetstream.specs import (
    ADVISORY_MAX_DELIVERIES,
    ExhaustedMarks,
    channel_observation,
    channel_spec_for,
    consumer_config_for_spec,
    consumer_credit,
    durable_of,
    enum_text,
    stream_config_for_spec,
    stream_of,
    subscription_spec_for,
    unknown_from,
)
from videoflow.backends.jetstream.streams import delete_run_streams, ensure_stream
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
    PublicationUnknown,
    PublishOutcome,
    Receipt,
    Rejected,
    SettleConfirmed,
    SettleOutcome,
    SettleResult,
    SettleStale,
    SettleUnknown,
    SubscriptionId,
    SubscriptionObservation,
    SubscriptionSpec,
    Terminal,
    Unknown,
    UnobservableState,
    VerifiedChannel,
    VerifiedSubscription,
    require_settle_outcomes,
)
from videoflow.backends.messaging_types import DUPLICATE_WINDOW_SECONDS
from videoflow.broker.link import (
    Outage,
    broker_known_from_env,
    outage_budget_from_env,
    retry_until,
    transient,
    wait_back,
)
from videoflow.broker.loop import (
    COALESCE_SECONDS,
    ErrorLog,
    Handoff,
    LoopRunner,
    LoopWake,
    close_client,
    connect_fail_fast,
)
from videoflow.core.naming import (
    control_subject_for,
    dlq_stream_name,
    dlq_subject_for,
    eos_subject_for,
    subject_for,
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

CALL_MARGIN_SECONDS: Final = 2.0
"""Added to a call's own bound when the caller's thread waits for the loop: the inner
bound answers first, and the outer one only catches a loop that is not running."""

BROKER_CALL_SECONDS: Final = 10.0
"""Bound of one provisioning or observation request."""

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _QueuedSettlement:
    """Settlements of one binding from one call, and a receipt for each."""

    receiver: SubscriptionReceiver
    items: list[tuple[DeliveryToken, SettleOutcome, str]]
    receipts: list[Receipt[SettleResult]]

    def resolve(self, results: list[SettleResult]) -> None:
        for receipt, result in zip(self.receipts, results, strict=True):
            receipt.set_result(result)  # an answer already set holds


def _resolve(queued: Sequence[_QueuedSettlement], result: SettleResult) -> None:
    for entry in queued:
        entry.resolve([result] * len(entry.items))


_QueuedPublication = tuple[str, Envelope, float, Receipt[PublishOutcome]]
"""(subject, envelope, deadline, the caller's receipt)."""


def _resolve_publications(queued: Sequence[_QueuedPublication], outcome: PublishOutcome) -> None:
    for *_, receipt in queued:
        receipt.set_result(outcome)  # a receipt answered already keeps its answer


def _result_by(receipt: Receipt[SettleResult], deadline: float) -> SettleResult:
    """A queued settlement's result, or SettleUnknown when the loop has not answered
    by the monotonic deadline (its own bound answers first; this only catches a stuck
    loop)."""
    try:
        return receipt.result(timeout=max(deadline - time.monotonic(), 0.0))
    except concurrent.futures.TimeoutError:
        return SettleUnknown("the backend's loop did not answer in time")


class _Binding:
    """One bound subscription: its spec, read-back, operation id, stream, receiver and
    MAX_DELIVERIES advisory subscription."""

    def __init__(self, spec: SubscriptionSpec, verified: VerifiedSubscription,
                 operation_id: str, stream: str, receiver: SubscriptionReceiver) -> None:
        self.spec, self.verified, self.operation_id = spec, verified, operation_id
        self.stream, self.receiver = stream, receiver
        self.advisory: Any = None



async def _stop_all(receivers: list[SubscriptionReceiver]) -> None:
    """Stop every pull loop at once: each withdraws its inbox with a round trip of its
    own, which one after another a node with many parents would pay per subscription."""
    await asyncio.gather(*(receiver.stop() for receiver in receivers))

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
            periodically (ack_wait / 3), as the messenger always has.
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
                             known=broker_known_from_env())
        self.outage.on_back.append(self._reconnected)
        self._runner = LoopRunner()
        self._client: Client | None = None
        self._js: JetStreamContext | None = None
        self._bindings: dict[SubscriptionId, _Binding] = {}
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
        self._publications: Handoff[_QueuedPublication] = Handoff(
            wake, self._drain_publications,
            lambda queued, reason: _resolve_publications(
                queued, Rejected(f"nothing was sent: {reason}", retryable=True)))
        self._settlements: Handoff[_QueuedSettlement] = Handoff(
            wake, self._drain_settlements,
            lambda queued, reason: _resolve(queued, SettleUnknown(reason)))
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
            return (f"the broker {self.nats_url} is away (reconnecting for up to "
                    f"{self.outage.budget:g} s)")
        return "the JetStream backend is not connected"

    def _reconnected(self) -> None:
        """The broker is back: the pull requests open before the outage died with the
        old connection, so every binding asks again at once."""
        for binding in list(self._bindings.values()):
            binding.receiver.reconnected()

    def pursue_until(self) -> float:
        return self.outage.pursue_until()

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
    def connected(self) -> bool:
        return self._client is not None and self._client.is_connected

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

    # ---------------------------------------------------------------- provisioning

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

    def ensure_dead_letters(self, operation_id: str) -> None:
        """Create (or find, read back, unchanged) the flow's dead-letter stream
        (dlq_stream_config: LIMITS, a week's max_age, flow-level owner labels, STREAM-8).
        Idempotent, so operation_id needs no bookkeeping.

        Raises:
            BrokerUnavailable: not connected, or the broker did not answer.
        """
        try:
            self._ride(lambda js: ensure_stream(js, dlq_stream_config(self.flow_id)))
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
                cannot keep (10074), or a stream whose retention or replicas contradict
                the spec.
            BrokerUnavailable: not connected, or the broker did not answer.
        """
        name = stream_of(spec.channel)
        try:
            created, verified = self._ride(lambda js: ensure_channel_stream(js, spec))
        except nats.js.errors.APIError as error:
            raise BrokerUnavailable(f"ensure_channel {name}: {error}",
                                    code=error.err_code) from error
        except (TimeoutError, nats.errors.Error) as error:
            raise BrokerUnavailable(f"ensure_channel {name}: {error}") from error
        if verified.effective is None:
            raise BrokerUnavailable(f"ensure_channel {name}: {verified.mismatches[0]}")
        if self._first_stream is None:
            self._first_stream = verified.effective
        return VerifiedChannel(spec=spec, name=name, created=created,
                               mismatches=verified.mismatches)

    def ensure_subscription(
        self, spec: SubscriptionSpec, operation_id: str
    ) -> VerifiedSubscription:
        """Bind the subscription's durable (creating it when absent, from a config that
        reproduces today's bytes), read it back, and start prefetching into its queue.
        A data subscription also subscribes to the broker's MAX_DELIVERIES advisory for
        its durable, which feeds unresolved (MSG-012). Repeating the same operation_id
        returns the same binding; a new one rebinds with the next generation, handing
        the old binding's parked deliveries back and making its tokens stale (MSG-011).

        Raises:
            UnobservableState: the channel's stream does not exist (reason 'missing').
            BrokerUnavailable: not connected, or the broker did not answer.
        """
        old = self._bindings.get(spec.id)
        if old is not None and old.operation_id == operation_id:
            return old.verified
        stream = stream_of(spec.id.channel)
        durable = durable_of(spec.id, self.instance_id)
        config = consumer_config_for_spec(spec, self.instance_id)
        generation = self._generations.get(spec.id, -1) + 1
        admit, on_skip = self._admission.get(spec.id, (None, None))

        try:
            created, verified = self._ride(
                lambda js: ensure_durable(js, stream, durable, config))
        except nats.js.errors.NotFoundError as error:
            raise UnobservableState(f"no stream {stream} to bind {durable} to",
                                    reason="missing", detail=str(error)) from error
        except (TimeoutError, nats.errors.Error) as error:
            raise BrokerUnavailable(f"ensure_subscription {durable}: {error}") from error
        client, _ = self._require()

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
                may_fetch=None if self.byte_budget is None else self._budget_admits,
                admit=admit, on_skip=on_skip,
                replies=self._replies, on_parked=self._ring)
            receiver.wanted = self._wanted  # before its pull loop's first request
            receiver.schedule = self._runner.call_soon
            if self.keepalive:
                receiver.keep_alive(spec.ack_wait_seconds / 3)
            advisory = None
            if spec.id.kind == "data":
                advisory = await client.subscribe(
                    f"{ADVISORY_MAX_DELIVERIES}.{stream}.{durable}",
                    cb=self._advisory_handler(spec.id))
            return receiver, advisory

        try:
            receiver, advisory = self._call(bind(), BROKER_CALL_SECONDS)
        except (TimeoutError, nats.errors.Error) as error:
            raise BrokerUnavailable(f"ensure_subscription {durable}: {error}") from error
        if old is not None:
            self._retired_budget_waits += old.receiver.budget_waits
        self._generations[spec.id] = generation
        result = VerifiedSubscription(spec=spec, name=durable, generation=generation,
                                      created=created, mismatches=verified.mismatches)
        binding = _Binding(spec, result, operation_id, stream, receiver)
        binding.advisory = advisory
        self._bindings[spec.id] = binding
        if self._stopped_receiving:
            self._call(receiver.stop(), self.fetch_timeout + BROKER_CALL_SECONDS)
        return result

    def _advisory_handler(self, subscription: SubscriptionId) -> Callable[[Msg], Any]:
        async def on_advisory(msg: Msg) -> None:
            # S11: fires on the next pull after the last delivery, carrying stream_seq.
            self._exhausted.mark_advisory(subscription, msg.data)

        return on_advisory

    def subscribe_control(self, callback: Callable[[], None]) -> None:
        """Invoke callback (on the loop, whichever thread runs it) when the run's
        flow-wide stop is published (core NATS, vf.{flow}.{run}._control.stop)."""
        client, _ = self._require()

        async def on_stop(_msg: Msg) -> None:
            callback()

        async def subscribe() -> None:
            await client.subscribe(control_subject_for(self.flow_id, self.run_id), cb=on_stop)
            # SUB is fire-and-forget; the PING/PONG of a flush proves the server has
            # registered it, so a stop published after this returns is never missed.
            await client.flush(timeout=int(BROKER_CALL_SECONDS))

        self._call(subscribe(), BROKER_CALL_SECONDS)

    # ------------------------------------------------------------------ publishing

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
        self._publications.put((self.subject_for(envelope.channel, envelope.kind), envelope,
                                deadline, receipt))
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

    def _drain_publications(self, queued: list[_QueuedPublication]) -> None:
        self._spawn(self._publish_batch(queued))

    async def _publish_batch(self, queued: list[_QueuedPublication]) -> None:
        client, replies, send_lock = self._client, self._replies, self._send_lock
        if client is None or replies is None or send_lock is None:
            _resolve_publications(queued, Rejected("the JetStream backend is not "
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
            _resolve_publications(queued, PublicationUnknown(
                "the backend shut down before the receipt arrived"))
            raise
        except Exception as error:
            # A bug here must not leave a caller waiting forever; say what happened.
            logger.exception("publication batch failed")
            _resolve_publications(queued, PublicationUnknown(f"the publication failed: "
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

    # ------------------------------------------------------------------- receiving

    def _budget_admits(self) -> bool:
        return self.byte_budget is None or self._resident() < self.byte_budget

    def _resident(self) -> int:
        # Called from the loop thread (the pull loops' gate) and the caller's: copy first.
        return sum(b.receiver.resident_bytes() for b in list(self._bindings.values()))

    def receive_any(
        self,
        subscriptions: Sequence[SubscriptionId],
        item_credit: int,
        byte_credit: int,
        deadline: float,
    ) -> list[tuple[SubscriptionId, Delivery]]:
        """Waits until deadline (monotonic) for any of the subscriptions' queues to hold
        a delivery and returns everything that became ready in that wait — nothing is
        dequeued that is not returned. Subscriptions not bound here contribute
        nothing. The caller's thread takes the deliveries itself, and while it waits
        runs the loop itself (LoopRunner.wait_until) until a binding parks one
        (_ring): a delivery is read, parked and taken on one thread, with no wake-up
        between threads.

        Raises:
            BrokerUnavailable: the backend's loop is not running, or its broker was
                away for longer than the outage budget (nothing more can arrive).
        """
        if self.outage.given_up is not None:
            raise BrokerUnavailable(self.outage.given_up)
        receivers = [(s, self._bindings[s].receiver) for s in subscriptions
                     if s in self._bindings]
        if item_credit < 1 or not receivers:
            return []
        if not self._runner.running:
            raise BrokerUnavailable("the JetStream backend's loop is not running")
        arrivals, runner = self._arrivals, self._runner
        ran = False  # whether this call has run the loop yet
        while True:
            seen = self._arrived  # read before the take: a park after it is not missed
            taken = take_round_robin(receivers, item_credit, byte_credit)
            if taken or ran and deadline <= time.monotonic():
                if not ran:
                    # What was handed over (a group's outputs, its settlements) goes
                    # out, on this thread: a caller working through a backlog turns
                    # once per COALESCE_SECONDS, so a batch of them shares one write.
                    runner.turn(COALESCE_SECONDS)
                return taken
            ran = True
            if deadline <= time.monotonic():  # a poll: what the loop has ready, once
                runner.turn(COALESCE_SECONDS)
                continue

            def arrived(seen: int = seen) -> bool:
                return self._arrived != seen

            def block(seconds: float, seen: int = seen) -> None:
                with arrivals:
                    if self._arrived == seen:
                        arrivals.wait(seconds)

            # The wait runs the loop, which sends what was handed over at once: no
            # turn before it (a coalesced one only woke the keeper for nothing).
            runner.wait_until(arrived, deadline, block)

    def catch_up(self, at_once: bool = False) -> None:
        """Run what the loop has ready on the caller's thread, without blocking
        (LoopRunner.turn): handed-over publications and settlements go out, at most
        one write per COALESCE_SECONDS for a fast caller unless at_once."""
        if self._runner.running:
            self._runner.turn(0.0 if at_once else COALESCE_SECONDS)

    def _ring(self) -> None:
        # On the loop, for each delivery parked. The waiter is woken once the read loop
        # has parked everything the bytes just read held, not once per delivery: a
        # wake-up per delivery handed the interpreter back and forth per message.
        if not self._ring_scheduled:
            self._ring_scheduled = True
            asyncio.get_running_loop().call_soon(self._ring_now)

    def _ring_now(self) -> None:
        self._ring_scheduled = False
        with self._arrivals:
            self._arrived += 1
            self._arrivals.notify_all()
        self._runner.poke()  # a receive_any running the loop on its own thread

    def set_admission(
        self,
        subscription: SubscriptionId,
        admit: Callable[[Delivery], bool],
        on_skip: Callable[[Delivery], None] | None = None,
    ) -> bool:
        """Run admit (on the loop thread: cheap, non-blocking) on every delivery of
        subscription before it is parked; a refused one is acked by the backend and,
        once confirmed, handed to on_skip off the loop's thread. Kept across rebinds.

        Returns:
            True: this backend keeps the filter.
        """
        self._admission[subscription] = (admit, on_skip)
        binding = self._bindings.get(subscription)
        if binding is not None:
            binding.receiver.admit, binding.receiver.on_skip = admit, on_skip
        return True

    def set_receive_depth(self, depth: int) -> None:
        """Park at most depth deliveries per subscription (never more than prefetch):
        a slow node that parks a deep prefetch holds inputs a competing replica could
        be processing, and has more to hand back when it leaves."""
        self._wanted = max(1, min(self.prefetch, depth))
        for binding in list(self._bindings.values()):
            binding.receiver.wanted = self._wanted

    def prefetched(self, subscription: SubscriptionId) -> int:
        binding = self._bindings.get(subscription)
        return 0 if binding is None else binding.receiver.parked

    def skipped(self, subscription: SubscriptionId) -> int:
        binding = self._bindings.get(subscription)
        return 0 if binding is None else binding.receiver.skipped

    def backlog(self, subscription: SubscriptionId) -> Known[int] | Unknown:
        """Parked deliveries plus the broker's num_pending as the latest delivery's reply
        subject carried it (0 once a fetch ended short: 404/408); no round trip."""
        binding = self._bindings.get(subscription)
        waiting = None if binding is None else binding.receiver.backlog()
        if waiting is None:
            return Unknown("unread", f"nothing received for {subscription.consumer} yet")
        return Known(waiting)

    def resident_bytes(self) -> int:
        """Envelope bytes this receiver holds unsettled right now (parked or handed
        out)."""
        return self._resident()

    def budget_waits(self) -> int:
        """How many times a pull loop paused because the byte budget was full."""
        return self._retired_budget_waits + sum(
            b.receiver.budget_waits for b in list(self._bindings.values()))

    # ------------------------------------------------------------------ settlement

    def settle_async(
        self, token: DeliveryToken, outcome: SettleOutcome, settlement_id: str
    ) -> Receipt[SettleResult]:
        """Queue one settlement and return at once. Settlements queued while the loop is
        busy go out together: one wake-up of the loop for the lot, and per durable one
        write of every acknowledgement with one round trip to confirm them
        (SubscriptionReceiver.settle_batch). The receipt always resolves, to what
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
        for the lot (SubscriptionReceiver.settle_batch).

        Raises:
            TypeError: an outcome is not Completed, Retry or Terminal (nothing is
                queued then).
        """
        require_settle_outcomes(settlements)
        receipts: list[Receipt[SettleResult]] = [Receipt(runner=self._runner)
                                                 for _ in settlements]
        by_binding: dict[SubscriptionId, list[int]] = {}
        for index, (token, _, _) in enumerate(settlements):
            by_binding.setdefault(token.subscription, []).append(index)
        for subscription, indexes in by_binding.items():
            binding = self._bindings.get(subscription)
            if binding is None:
                for index in indexes:
                    receipts[index].set_result(SettleStale("the subscription is not bound "
                                                           "here"))
                continue
            self._settlements.put(_QueuedSettlement(
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

    def _drain_settlements(self, queued: list[_QueuedSettlement]) -> None:
        """On the loop: settle everything queued, one batch per binding."""
        batches: dict[SubscriptionReceiver, list[_QueuedSettlement]] = {}
        for entry in queued:
            batches.setdefault(entry.receiver, []).append(entry)
        for receiver, batch in batches.items():
            self._spawn(self._settle_batch(receiver, batch))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._pipelined.add(task)  # a strong reference until it is done
        task.add_done_callback(self._pipelined.discard)

    async def _settle_batch(self, receiver: SubscriptionReceiver,
                            batch: list[_QueuedSettlement]) -> None:
        items = [item for entry in batch for item in entry.items]
        try:
            results = await receiver.settle_batch(items)
        except asyncio.CancelledError:
            _resolve(batch, SettleUnknown("the backend shut down before the broker "
                                          "confirmed the settlement"))
            raise
        except Exception as error:
            # A bug here must not leave a caller waiting forever; say what happened.
            logger.exception("settlement batch failed")
            _resolve(batch, SettleUnknown(f"the settlement failed: {error!r}"))
            return
        for (token, outcome, _), result in zip(items, results, strict=True):
            if isinstance(outcome, Terminal) and isinstance(result, SettleConfirmed):
                self._exhausted.clear(token.subscription, token.stream_seq)
        start = 0
        for entry in batch:
            entry.resolve(results[start:start + len(entry.items)])
            start += len(entry.items)

    def renew(self, token: DeliveryToken) -> LeaseObservation:
        binding = self._bindings.get(token.subscription)
        if binding is None:
            return LeaseObservation("stale", "the subscription is not bound here")
        try:
            observed: LeaseObservation = self._call(binding.receiver.renew(token),
                                                    self.ack_confirm_seconds)
        except (TimeoutError, BrokerUnavailable) as error:
            return LeaseObservation("unknown", f"the backend's loop did not answer: {error}")
        return observed

    def supersede(self, token: DeliveryToken) -> bool:
        binding = self._bindings.get(token.subscription)
        if binding is None:
            return False

        async def retire() -> bool:
            return binding.receiver.supersede(token)

        return bool(self._call(retire(), self.ack_confirm_seconds))

    def mark_exhausted(self, subscription: SubscriptionId, stream_sequence: int | None) -> None:
        """Count a retained message as unresolved work in observe_subscription without a
        broker advisory (DELIV-15's pending handoff; MSG-012). stream_sequence None
        counts one anonymous message, cleared by the next Terminal of the subscription
        that matches no marked sequence. Cleared by the Terminal settlement of that
        message, or by the message leaving the stream."""
        self._exhausted.mark(subscription, stream_sequence)

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
