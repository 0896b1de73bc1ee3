"""The messaging contract both adapters (memory, JetStream) implement.

A ``MessagingBackend`` owns the transport: the connection, the channels and
subscriptions it provisions, prefetch, leases, the settlement of every delivery token
it hands out, and publication outcomes. It knows nothing about joining inputs,
dead-letter policy, payload bytes or end-of-stream drains — those stay in the
messenger, which composes a backend with a payload store.

The values it trades in live in ``messaging_types`` (and ``Known`` / ``Unknown`` in
``videoflow.observation``) and are re-exported here, so
``from videoflow.backends.messaging import Known, Unknown, ProfileRequest`` is the one
import path callers use. Every method is synchronous: an adapter that needs an event
loop runs its own (``loop``). Deadlines are absolute ``time.monotonic()`` values.
"""

from __future__ import annotations

import abc
import concurrent.futures
import threading
import time
from asyncio import AbstractEventLoop
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from videoflow.backends.messaging_types import (
    DURABLE_CONTROL,
    ENVELOPE_KINDS,
    KINDS,
    LIVE_LATEST,
    PROFILES,
    RELIABLE_WORK,
    REPLAY_ARCHIVE,
    STREAM_PROFILES,
    Accepted,
    ChannelId,
    ChannelObservation,
    ChannelSpec,
    CleanupObservation,
    Completed,
    Delivery,
    DeliveryToken,
    Envelope,
    EnvelopeKind,
    Kind,
    LeaseObservation,
    LeaseState,
    MessagingCapabilities,
    ProfileRequest,
    PublicationUnknown,
    PublicationUnresolvable,
    PublishOutcome,
    Rejected,
    Retry,
    SettleConfirmed,
    SettleOutcome,
    SettleResult,
    SettleStale,
    SettleUnknown,
    SubscriptionId,
    SubscriptionObservation,
    SubscriptionSpec,
    Terminal,
    VerifiedChannel,
    VerifiedSubscription,
)
from videoflow.core.naming import dlq_subject_for, eos_subject_for, subject_for
from videoflow.errors import BrokerUnavailable, IncompatibleProfile, UnobservableState
from videoflow.observation import UNKNOWN_REASONS, Known, Observation, Unknown, UnknownReason

__all__ = [
    "DURABLE_CONTROL",
    "ENVELOPE_KINDS",
    "KINDS",
    "LIVE_LATEST",
    "PROFILES",
    "RELIABLE_WORK",
    "REPLAY_ARCHIVE",
    "STREAM_PROFILES",
    "UNKNOWN_REASONS",
    "Accepted",
    "BrokerUnavailable",
    "ChannelId",
    "ChannelObservation",
    "ChannelSpec",
    "CleanupObservation",
    "Completed",
    "Delivery",
    "DeliveryToken",
    "Envelope",
    "IncompatibleProfile",
    "EnvelopeKind",
    "Kind",
    "Known",
    "LeaseObservation",
    "LeaseState",
    "MessagingBackend",
    "MessagingCapabilities",
    "Observation",
    "ProfileRequest",
    "PublicationUnknown",
    "PublicationUnresolvable",
    "PublishOutcome",
    "Receipt",
    "require_settle_outcomes",
    "Rejected",
    "Retry",
    "SettleConfirmed",
    "SettleOutcome",
    "SettleResult",
    "SettleStale",
    "SettleUnknown",
    "SubscriptionId",
    "SubscriptionObservation",
    "SubscriptionSpec",
    "Terminal",
    "Unknown",
    "UnknownReason",
    "UnobservableState",
    "VerifiedChannel",
    "VerifiedSubscription",
    "channel_subject",
]


def require_settle_outcomes(
    settlements: Sequence[tuple[DeliveryToken, SettleOutcome, str]]
) -> None:
    """Refuse a batch of settlements holding anything but Completed, Retry or Terminal,
    before any of it is started.

    Raises:
        TypeError: naming the first outcome that is none of them.
    """
    for _, outcome, _ in settlements:
        if not isinstance(outcome, (Completed, Retry, Terminal)):
            raise TypeError(f"not a settle outcome: {outcome!r}")


_WAITER_LOCK = threading.Lock()


T = TypeVar("T")


class LoopDriver(Protocol):
    """What a Receipt needs of the loop its answer comes from (the JetStream
    adapter's LoopRunner): a wait that runs the loop on the waiting thread, and a
    poke when an answer is set."""

    def wait_until(self, done: Callable[[], bool], deadline: float | None,
                   block: Callable[[float], Any]) -> None: ...

    def poke(self) -> None: ...


class Receipt(Generic[T]):
    """The answer to one publish_async or settle_async: set once, by the adapter, and
    read by the caller.

    A concurrent.futures.Future would do, but it builds a Condition per call and
    takes its lock on every look, and a node makes tens of thousands a second; a
    receipt is three slots, and an Event only once somebody has to wait. The first
    answer set is the answer; later ones are ignored (None is never an answer).

    Arguments:
        answer: the answer, when it is known already (nothing to wait for).
        runner: the adapter's loop runner, when the answer comes from a loop the
            waiting thread should run itself while it waits (LoopRunner.wait_until);
            None: the answer is set by another thread, and result() just waits.
    """

    __slots__ = ("_answer", "_runner", "_waiter")

    def __init__(self, answer: T | None = None, runner: LoopDriver | None = None) -> None:
        self._answer = answer
        self._waiter: threading.Event | None = None
        self._runner = runner

    def done(self) -> bool:
        return self._answer is not None

    def set_result(self, answer: T) -> None:
        if self._answer is not None:
            return
        self._answer = answer
        # Stored before the waiter is read, and result() publishes its waiter before
        # it reads the answer again: one of the two always sees the other.
        waiter = self._waiter
        if waiter is not None:
            waiter.set()
        if self._runner is not None:
            self._runner.poke()

    def result(self, timeout: float | None = None) -> T:
        """The answer, waiting up to timeout seconds (None: for as long as it takes).

        Raises:
            concurrent.futures.TimeoutError: no answer within timeout.
        """
        answer = self._answer
        if answer is None:
            with _WAITER_LOCK:
                if self._waiter is None:
                    self._waiter = threading.Event()
                waiter = self._waiter
            answer = self._answer
            if answer is None:
                if self._runner is not None:
                    deadline = None if timeout is None else time.monotonic() + timeout
                    self._runner.wait_until(self.done, deadline, waiter.wait)
                else:
                    waiter.wait(timeout)
                answer = self._answer
                if answer is None:
                    raise concurrent.futures.TimeoutError("no answer yet")
        return answer


def channel_subject(channel: ChannelId, kind: str) -> str:
    """The subject a channel's envelopes of kind go to ('data', 'eos' or 'dlq'): what
    every adapter's subject_for answers.

    Raises:
        ValueError: any other kind.
    """
    if kind == "data":
        return subject_for(channel.flow, channel.run, channel.node)
    if kind == "eos":
        return eos_subject_for(channel.flow, channel.run, channel.node)
    if kind == "dlq":
        return dlq_subject_for(channel.flow, channel.run, channel.node)
    raise ValueError(f"kind must be 'data', 'eos' or 'dlq', got {kind!r}")


class MessagingBackend(abc.ABC):
    """The transport half of a messenger: what any broker adapter must promise.

    Methods with a body are defaults for adapters that keep no such machinery (no
    local prefetch, no admission filter, tokens already fenced by attempt and
    generation); every abstract method is a promise each adapter keeps itself.
    """

    # ------------------------------------------------------------------ lifecycle

    @abc.abstractmethod
    def start(self) -> None:
        """Connect (an adapter with I/O does so on a fresh loop thread of its own).

        Raises:
            BrokerUnavailable: the broker cannot be reached.
        """

    @property
    @abc.abstractmethod
    def connected(self) -> bool:
        """Whether the backend currently holds a live connection to its broker."""

    @property
    @abc.abstractmethod
    def loop(self) -> AbstractEventLoop:
        """The event loop the adapter's broker I/O and callbacks run on."""

    def pursue_until(self) -> float:
        """Until when (monotonic) an outcome a broker outage left unknown or unsent may
        still be pursued past its own deadline: while the broker is away, until the
        adapter's outage budget runs out; shortly after it is back, so what the outage
        left unresolved resolves then. The publication ladder waits on this instead of
        failing a group whose broker is only away. 0.0 (the default, for an adapter
        whose broker cannot go away) means no extension."""
        return 0.0

    def given_up(self) -> str | None:
        """Why the adapter gave its broker up for good -- away past the outage budget:
        nothing can be published, observed or settled any more, so an outcome still
        unknown stays so -- or None while the broker may still answer (the default,
        for an adapter whose broker cannot go away)."""
        return None

    @abc.abstractmethod
    def stop_receiving(self) -> int:
        """Stop admitting input on every bound subscription — the quiesce half of a
        graceful retirement (RUN-030).

        Nothing more is fetched, and every delivery parked locally (fetched, never
        handed to a receiver) is handed back to the broker at once, so a survivor
        picks it up now rather than after ack_wait. Deliveries already handed out stay
        the receiver's to settle. Idempotent: a second call hands back nothing more.

        Returns:
            how many parked deliveries were handed back.
        """

    @abc.abstractmethod
    def shutdown(self, hand_back: bool = True) -> None:
        """Stop receiving, hand back every delivery this receiver still holds (parked
        or handed out and unsettled; an already settled one is left alone), flush
        pending publishes and release the connection.

        Arguments:
            hand_back: False closes without handing anything back — what a crashed
                process looks like to the broker (its leases lapse on their own).
                Crash simulations pass it; a worker never does.
        """

    @abc.abstractmethod
    def close(self, owned: Sequence[ChannelId], expected_generation: str) -> CleanupObservation:
        """Delete exactly the owned channels, by ownership, never by name prefix.

        Arguments:
            owned: the channels to remove.
            expected_generation: the provisioning generation they must carry; a
                channel of another generation is not removed.

        Returns:
            removed (confirmed gone; already gone counts), remaining (owned, delete
            failed) and complete — False whenever anything remains or the inventory
            could not be read. Re-running is safe, and is the remedy.
        """

    @abc.abstractmethod
    def capabilities(self) -> MessagingCapabilities:
        """What this broker offers. Parts that need a read-back (max_payload,
        replication, storage) are Unknown('unread') until they have been read."""

    # ---------------------------------------------------------------- provisioning

    @abc.abstractmethod
    def subject_for(self, channel: ChannelId, kind: str) -> str:
        """The subject (address) a channel's messages of kind use: 'data', 'eos', or
        'dlq' for the dead letters of the channel's node (in the flow's dead-letter
        stream, STREAM-8)."""

    @abc.abstractmethod
    def ensure_dead_letters(self, operation_id: str) -> None:
        """Create or bind the flow's dead-letter stream (STREAM-8), so a dead letter
        can be published ('dlq' envelopes). Flow-scoped and kept for
        DLQ_RETENTION_SECONDS: no run's teardown or close ever removes it. Until it
        exists, a dead-letter publish is Rejected (not retryable), as any publish no
        stream captures.

        Arguments:
            operation_id: names this provisioning step, so a retry is idempotent.

        Raises:
            BrokerUnavailable: not connected, or the broker did not answer.
        """

    @abc.abstractmethod
    def ensure_channel(self, spec: ChannelSpec, operation_id: str) -> VerifiedChannel:
        """Create or reconcile the channel and read back its effective configuration.

        "Already exists" is never accepted without inspection; a field the broker does
        not honour is reported in VerifiedChannel.mismatches, never trusted.

        Arguments:
            spec: what the channel must provide.
            operation_id: names this provisioning step, so a retry is idempotent.

        Raises:
            IncompatibleProfile: an immutable mismatch (retention, replicas), or a
                profile the broker cannot promise.
            BrokerUnavailable: the broker did not answer.
        """

    @abc.abstractmethod
    def ensure_subscription(
        self, spec: SubscriptionSpec, operation_id: str
    ) -> VerifiedSubscription:
        """Bind the subscription (creating it when absent), read it back, and start
        receiving for it. Its credit is the provisioned credit (MSG-017); a data
        subscription also starts counting exhausted messages as unresolved (MSG-012).

        Arguments:
            spec: how to bind it.
            operation_id: names this step, so a retry is idempotent.

        Raises:
            BrokerUnavailable: the broker did not answer.
        """

    @abc.abstractmethod
    def subscribe_control(self, callback: Callable[[], None]) -> None:
        """Invoke callback (on the backend's loop) when the run's flow-wide stop is
        published."""

    # ------------------------------------------------------------------ publishing

    @abc.abstractmethod
    def publish(self, envelope: Envelope, deadline: float) -> PublishOutcome:
        """Publish before a monotonic deadline; the outcome is typed, never guessed.

        Returns:
            Accepted (stored, or a duplicate of a stored msg_id); Rejected when the
            broker definitely refused, retryable saying whether waiting helps;
            PublicationUnknown when the deadline expired after the send — a lost
            receipt is never a rejection (MSG-013, MSG-014).
        """

    def publish_async(self, envelope: Envelope, deadline: float) -> Receipt[PublishOutcome]:
        """Start a publication and return without waiting for the broker's receipt, so
        a producer can send its next message while this one is in flight: one
        publisher is then not held to one round trip per message.

        The receipt always resolves — never to an error, and never later than the
        deadline by more than the adapter's scheduling — to what publish would have
        returned: Accepted, Rejected or PublicationUnknown, never a guess (MSG-013,
        MSG-014). Publications of one caller reach the broker in the order they were
        started. The default publishes now and returns a receipt already answered.
        """
        return Receipt(self.publish(envelope, deadline))

    @abc.abstractmethod
    def observe_publication(self, envelope: Envelope) -> PublishOutcome:
        """Resolve an earlier PublicationUnknown by an idempotent re-publish of the same
        msg_id: inside the broker's duplicate window exactly one accepted copy results
        (duplicate when the first send was stored); beyond it nothing can be known and
        the answer is PublicationUnresolvable (MSG-014)."""

    # ------------------------------------------------------------------- receiving

    def receive(
        self, subscription: SubscriptionId, item_credit: int, byte_credit: int, deadline: float
    ) -> list[Delivery]:
        """Up to item_credit deliveries (and about byte_credit bytes; 0 = unbounded) from
        one subscription, waiting until the monotonic deadline for the first. Each
        carries a fresh DeliveryToken this backend must later honour or call stale.
        The default is receive_any over that one subscription."""
        taken = self.receive_any([subscription], item_credit, byte_credit, deadline)
        return [delivery for _, delivery in taken]

    @abc.abstractmethod
    def receive_any(
        self,
        subscriptions: Sequence[SubscriptionId],
        item_credit: int,
        byte_credit: int,
        deadline: float,
    ) -> list[tuple[SubscriptionId, Delivery]]:
        """Wait until the monotonic deadline for any subscription to hold a delivery and
        return everything that became ready in that wait: a delivery already dequeued
        is always returned, never dropped."""

    def set_admission(
        self,
        subscription: SubscriptionId,
        admit: Callable[[Delivery], bool],
        on_skip: Callable[[Delivery], None] | None = None,
    ) -> bool:
        """Run admit on every delivery of subscription before it is parked; a refused
        delivery is settled Completed by the backend at once and, once that is
        confirmed, handed to on_skip off the backend's threads. admit must be cheap
        and must not block.

        Returns:
            whether the backend keeps such a filter. The default keeps none and
            returns False: the caller then decides on the receiving side.
        """
        return False

    def catch_up(self, at_once: bool = False) -> None:
        """Let the adapter's I/O run on the caller's thread for a moment, without
        blocking: what was handed over goes out, what has arrived is read. A caller
        that hands work over and then runs code of its own (a producer between
        next() calls) calls it between the two. The default does nothing: an adapter
        whose I/O runs on threads of its own needs no such moment.

        Arguments:
            at_once: send now even when the adapter would batch a fast caller's
                work (a REALTIME output, which a newer one supersedes while it
                waits)."""
        return None

    def prefetched(self, subscription: SubscriptionId) -> int:
        """Deliveries fetched and parked locally for subscription (default: 0, for a
        backend that keeps none)."""
        return 0

    def skipped(self, subscription: SubscriptionId) -> int:
        """Deliveries the admission filter refused and the backend acked on the
        consumer's behalf (default: 0, no filter)."""
        return 0

    def backlog(self, subscription: SubscriptionId) -> Known[int] | Unknown:
        """Deliveries waiting to be taken for subscription, as far as this adapter knows
        without asking the broker: parked locally plus what the broker said it still
        held at its latest answer (a delivery, or a fetch that ended short). Cheap
        enough to ask before every sweep of a time join, which counts a parent with a
        backlog as heard from (GroupAssembler.heard): a node that is only behind its
        parents gives up on nothing they sent. The default, and an adapter that has
        heard nothing yet, answer Unknown, which counts as no backlog."""
        return Unknown("unread", "this adapter does not track what waits for a subscription")

    @abc.abstractmethod
    def resident_bytes(self) -> int:
        """Envelope bytes this receiver holds unsettled right now, parked or handed out
        — what the prefetch byte budget is measured against (RUN-025)."""

    def budget_waits(self) -> int:
        """How many times receiving paused because the byte budget was full (RUN-025;
        default: 0, for a backend without a budget)."""
        return 0

    def set_receive_depth(self, depth: int) -> None:  # noqa: B027 (optional: a no-op)
        """Park at most depth deliveries per subscription ahead of the caller (the
        messenger sets it to what its node gets through in a short while). The
        default ignores it: an adapter that parks nothing ahead has nothing to bound."""

    # ------------------------------------------------------------------ settlement

    @abc.abstractmethod
    def settle(
        self, token: DeliveryToken, outcome: SettleOutcome, settlement_id: str
    ) -> SettleResult:
        """Settle one delivery: Completed, Retry(delay) or Terminal(record_ref).

        A token superseded by a newer attempt or binding is SettleStale without any
        broker call, so a stale handle never terminates the delivery that replaced it
        (MSG-011). SettleConfirmed only once the broker confirmed; otherwise
        SettleUnknown, on which no payload obligation may be released (PAY-004).
        Terminal carries the durable record it is settled against (DELIV-15).

        Arguments:
            settlement_id: names this settlement, so a retried call is idempotent.
        """

    def settle_many(
        self, settlements: Sequence[tuple[DeliveryToken, SettleOutcome, str]]
    ) -> list[SettleResult]:
        """Settle several deliveries — every input of a group, say — with one wait.

        Each (token, outcome, settlement_id) gets exactly the result settle would give
        it, in order; one stale or unconfirmed settlement says nothing about the others.
        An adapter that talks to a broker pipelines them, so a batch costs about one
        round trip rather than one per delivery. The default settles each in turn.
        """
        return [self.settle(*settlement) for settlement in settlements]

    def settle_async(
        self, token: DeliveryToken, outcome: SettleOutcome, settlement_id: str
    ) -> Receipt[SettleResult]:
        """Start a settlement and return without waiting for the broker, so a receiver
        can go on to its next input while the acknowledgement is in flight: one
        receiver is then not held to one round trip per message.

        The receipt always resolves — never to an error, and never later than the
        adapter's confirmation bound — to what settle would have returned: a payload
        obligation is released only once it holds SettleConfirmed (PAY-004). Queued
        settlements of one caller are sent in the order they were made. The default
        settles now and returns a receipt already answered.

        Raises:
            TypeError: outcome is not Completed, Retry or Terminal.
        """
        require_settle_outcomes([(token, outcome, settlement_id)])
        return Receipt(self.settle(token, outcome, settlement_id))

    def settle_many_async(
        self, settlements: Sequence[tuple[DeliveryToken, SettleOutcome, str]]
    ) -> list[Receipt[SettleResult]]:
        """settle_async for each of settlements (token, outcome, settlement_id), in
        order, started together: an adapter that confirms a batch with one round trip
        (settle_many) confirms these so too. The default starts each in turn.

        Raises:
            TypeError: an outcome is not Completed, Retry or Terminal (nothing is
                started then).
        """
        require_settle_outcomes(settlements)
        return [self.settle_async(token, outcome, settlement_id)
                for token, outcome, settlement_id in settlements]

    @abc.abstractmethod
    def renew(self, token: DeliveryToken) -> LeaseObservation:
        """Extend the lease of an unsettled delivery; a stale token is reported stale
        and nothing is sent (MSG-011)."""

    def supersede(self, token: DeliveryToken) -> bool:
        """Retire a token locally — the receiver holds a newer attempt of the same
        message — without any broker settlement; a later settle of it is SettleStale.

        Returns:
            whether the token was live. The default is a no-op returning False, for
            adapters whose tokens are already fenced by attempt and generation.
        """
        return False

    def lapse_leases(self, subscription: SubscriptionId) -> bool:
        """Make every lease of subscription's durable lapse now, so what the broker
        handed out on a path that was cut (a server that died with deliveries on their
        way) is delivered again at once, not once ack_wait lapses. What the receiver
        holds comes again too, a newer attempt of the same message (supersede).

        Returns:
            whether the leases were made to lapse. The default is a no-op returning
            False, for adapters whose deliveries cannot be cut off in flight. A durable
            with a delivery cap is left alone (a lapse counts as a delivery): only the
            durables of a run whose ledger is in NATS KV, as workers and the local
            engine keep it, have none.
        """
        return False

    @abc.abstractmethod
    def mark_exhausted(self, subscription: SubscriptionId, stream_sequence: int | None) -> None:
        """Count a retained message as unresolved in observe_subscription: the
        messenger's ledger found its retry budget exhausted and could not record its
        dead letter (DELIV-15's pending handoff), so nothing will resolve it until the
        record exists (MSG-012). Cleared by the settlement that terminates it, or by
        the message leaving the channel."""

    # ---------------------------------------------------------------- observations

    @abc.abstractmethod
    def observe_channel(self, channel: ChannelId) -> Known[ChannelObservation] | Unknown:
        """The channel's state (first/last sequence, message count, retention), or
        Unknown saying why it could not be read — missing when it does not exist."""

    @abc.abstractmethod
    def observe_subscription(
        self, subscription: SubscriptionId
    ) -> Known[SubscriptionObservation] | Unknown:
        """Available, leased, unresolved and dropped counts, or Unknown when they could
        not be read. Unresolved includes exhausted messages the broker retains but
        will never resolve, so such work is never "nothing pending" (MSG-012)."""

    def observe_subscriptions(
        self, subscriptions: Sequence[SubscriptionId]
    ) -> list[Known[SubscriptionObservation] | Unknown]:
        """observe_subscription for each subscription, in order. The default asks for
        one after another; an adapter with a network between it and the counts asks
        for them together."""
        return [self.observe_subscription(subscription) for subscription in subscriptions]

    @abc.abstractmethod
    def observe_ack_floor(self, subscription: SubscriptionId) -> Known[int] | Unknown:
        """The stream sequence at or below which every message is settled for any data
        subscription of the run, bound here or not, or Unknown. An unobservable floor
        releases nothing (PAY-006)."""
