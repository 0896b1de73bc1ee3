"""An in-process MessagingBackend: the contract kept without a broker process.

``MemoryMessagingBackend`` is one receiver (one process of a run) on a ``MemoryBroker``
that several receivers may share — so competing consumers, a quiesce that hands parked
work to a survivor (RUN-030) and a crash whose leases lapse can all be played
deterministically in one test. Leases, retry delays and duplicate windows are measured
on the broker's injectable clock.

It mirrors what the JetStream adapter does (streams per channel, durables with ack_wait
leases and max_deliver, INTEREST/LIMITS retention, DiscardPolicy NEW/OLD, a msg_id
duplicate window, local prefetch, an admission filter, a byte budget, tokens fenced by
attempt and binding generation) so the messenger can be tested without a server. It is
not evidence of how JetStream behaves.

One deliberate difference: there is no keepalive. The JetStream adapter renews every
unsettled lease periodically; here a lease lasts ack_wait on the broker's clock unless
renew is called, so a test plays a lapse by advancing the clock. A parked delivery
whose lease lapsed and was redelivered elsewhere is discarded rather than handed out.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from asyncio import AbstractEventLoop
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from videoflow import clock
from videoflow.backends.memory_broker import (
    DEFAULT_DUPLICATE_WINDOW_SECONDS,
    DEFAULT_MAX_PAYLOAD,
    BrokerAnswer,
    MemoryBroker,
)
from videoflow.backends.messaging import (
    LIVE_LATEST,
    RELIABLE_WORK,
    Accepted,
    BrokerUnavailable,
    ChannelId,
    ChannelObservation,
    ChannelSpec,
    CleanupObservation,
    Completed,
    Delivery,
    DeliveryToken,
    Envelope,
    Known,
    LeaseObservation,
    MessagingBackend,
    MessagingCapabilities,
    PublicationUnknown,
    PublicationUnresolvable,
    PublishOutcome,
    Rejected,
    Retry,
    SettleConfirmed,
    SettleOutcome,
    SettleResult,
    SettleStale,
    SubscriptionId,
    SubscriptionObservation,
    SubscriptionSpec,
    Terminal,
    Unknown,
    UnobservableState,
    VerifiedChannel,
    VerifiedSubscription,
    channel_subject,
)
from videoflow.backends.messaging_types import trusted_delivery
from videoflow.core.naming import (
    stream_name_for,
)

__all__ = ["DEFAULT_PREFETCH", "MemoryBroker", "MemoryMessagingBackend"]

DEFAULT_PREFETCH = 4
"""Per-subscription local prefetch depth, as the JetStream adapter's default."""

_WAIT_SLICE_SECONDS = 0.05
"""How long one wait for a delivery sleeps before re-applying the clock to the leases
(a lease lapse notifies nobody, so a waiting receiver looks again)."""


_PUBLISH_TIMES_PRUNE_AT = 4096
"""Remembered first-send times (for observe_publication) beyond which those outside the
duplicate window are forgotten."""


@dataclass(slots=True)
class _Binding:
    spec: SubscriptionSpec
    verified: VerifiedSubscription
    operation_id: str
    parked: deque[Delivery] = field(default_factory=deque)
    admit: Callable[[Delivery], bool] | None = None
    on_skip: Callable[[Delivery], None] | None = None
    skipped: int = 0


class MemoryMessagingBackend(MessagingBackend):
    """One receiver of a run on an in-process broker.

    Arguments:
        broker: the broker this receiver talks to; share one between backends to play
            several processes. None makes a private one on clock.
        flow_id / run_id: the run (its flow-wide stop is what subscribe_control hears).
        clock: the monotonic clock of a private broker (ignored when broker is given:
            the broker's clock rules).
        prefetch: per-subscription local prefetch depth.
        byte_budget: the most envelope bytes this receiver holds unsettled, parked or
            handed out, before it stops fetching (RUN-025). A fetch starts only below
            the budget, so the total may exceed it by one message. None: unbounded.
        generation: the provisioning generation channels created here carry (close
            removes only channels of the generation it is given).
        duplicate_window / max_payload: a private broker's settings.
    """

    def __init__(
        self,
        broker: MemoryBroker | None = None,
        *,
        flow_id: str = "flow",
        run_id: str = "run",
        clock: Callable[[], float] = time.monotonic,
        prefetch: int = DEFAULT_PREFETCH,
        byte_budget: int | None = None,
        generation: str = "0",
        duplicate_window: float = DEFAULT_DUPLICATE_WINDOW_SECONDS,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
    ) -> None:
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"prefetch must be an int >= 1, got {prefetch!r}")
        if byte_budget is not None and (isinstance(byte_budget, bool) or byte_budget < 1):
            raise ValueError(f"byte_budget must be None or an int >= 1, got {byte_budget!r}")
        self.broker = broker if broker is not None else MemoryBroker(
            clock=clock, duplicate_window=duplicate_window, max_payload=max_payload)
        self.flow_id, self.run_id = flow_id, run_id
        self.prefetch, self.byte_budget, self.generation = prefetch, byte_budget, generation
        self.instance_id = uuid.uuid4().hex[:12]  # names this receiver's EOS durables
        self._bindings: dict[SubscriptionId, _Binding] = {}
        self._admission: dict[SubscriptionId, tuple[Callable[[Delivery], bool],
                                                    Callable[[Delivery], None] | None]] = {}
        self._generations: dict[SubscriptionId, int] = {}
        self._held: dict[DeliveryToken, Delivery] = {}
        self._settlements: dict[str, tuple[DeliveryToken, SettleResult]] = {}
        self._publish_times: OrderedDict[tuple[ChannelId, str], float] = OrderedDict()
        self._control: list[Callable[[], None]] = []
        self._receiving = False
        self._connected = False
        self._budget_waits = 0
        self._loop: AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Fault injection: how many of the next publishes lose their receipt.
        self._lose_receipts = 0
        self._drop_sends = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the backend's own loop thread (where control callbacks run) and mark
        the receiver connected. An in-process broker is always reachable, so this never
        raises BrokerUnavailable. Idempotent."""
        if self._connected:
            return
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="videoflow-memory-loop",
                                  daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        self._connected, self._receiving = True, True

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def loop(self) -> AbstractEventLoop:
        """The loop control callbacks run on.

        Raises:
            BrokerUnavailable: before start or after shutdown.
        """
        if self._loop is None:
            raise BrokerUnavailable("the memory backend is not started")
        return self._loop

    def _require_connected(self) -> None:
        if not self._connected:
            raise BrokerUnavailable("the memory backend is not started (or was shut down)")

    def stop_receiving(self) -> int:
        self._receiving = False
        handed_back = 0
        with self.broker.lock:
            for sub, binding in self._bindings.items():
                while binding.parked:
                    delivery = binding.parked.popleft()
                    self._held.pop(delivery.token, None)
                    # RUN-030: a NAK now, not a lease left to lapse on a dying process.
                    self.broker.nak(self._wire(sub), delivery.stream_seq,
                                    delivery.num_delivered, 0.0)
                    handed_back += 1
        return handed_back

    def shutdown(self, hand_back: bool = True) -> None:
        if hand_back:
            self.stop_receiving()
            with self.broker.lock:
                for token in list(self._held):
                    self.broker.nak(self._wire(token.subscription), token.stream_seq, token.attempt,
                                    0.0)
        # hand_back=False: nothing reaches the broker; the leases lapse on their own.
        self._receiving = False
        self._held.clear()
        for binding in self._bindings.values():
            binding.parked.clear()
        for notify in self._control:
            self.broker.unsubscribe_control(self.flow_id, self.run_id, notify)
        self._control.clear()
        self._connected = False
        # Publishes are synchronous here, so there is nothing pending to flush.
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=5.0)
            self._loop.close()
        self._loop, self._thread = None, None

    def close(self, owned: Sequence[ChannelId], expected_generation: str) -> CleanupObservation:
        """Delete exactly the owned channels of expected_generation. A channel of another
        generation is not this provisioning's: it is left standing and not reported
        (as the JetStream teardown leaves a stream it cannot attribute)."""
        removed: list[str] = []
        for channel in owned:
            name = stream_name_for(channel.flow, channel.run, channel.node)
            if self.broker.delete_stream(channel, expected_generation) != "foreign":
                removed.append(name)
                self._forget_channel(channel)
        return CleanupObservation(removed=tuple(removed), remaining=(), complete=True)

    def _forget_channel(self, channel: ChannelId) -> None:
        for sub in [s for s in self._bindings if s.channel == channel]:
            del self._bindings[sub]
        for token in [t for t in self._held if t.subscription.channel == channel]:
            del self._held[token]

    def capabilities(self) -> MessagingCapabilities:
        """Everything is Known: this adapter can always observe itself."""
        return MessagingCapabilities(
            backend="memory", profiles=frozenset({RELIABLE_WORK, LIVE_LATEST}), durable=False,
            max_payload=Known(self.broker.max_payload), replicas=Known(1),
            storage=Known("memory"),
        )

    # ---------------------------------------------------------------- provisioning

    def subject_for(self, channel: ChannelId, kind: str) -> str:
        return channel_subject(channel, kind)

    def ensure_dead_letters(self, operation_id: str) -> None:
        """Create the flow's dead-letter stream on the broker (MemoryBroker.dead_letters
        reads it back). Naturally idempotent.

        Raises:
            BrokerUnavailable: not started.
        """
        self._require_connected()
        self.broker.ensure_dead_letters(self.flow_id)

    def ensure_channel(self, spec: ChannelSpec, operation_id: str) -> VerifiedChannel:
        """Create or reconcile the channel. reliable_work is INTEREST retention with
        DiscardPolicy NEW at batch_max_msgs; live_latest is LIMITS with DiscardPolicy
        OLD at realtime_buffer; max_bytes bounds either. replicas > 1 is reported as a
        mismatch (one copy, in this process). Naturally idempotent, so operation_id
        needs no bookkeeping."""
        self._require_connected()
        created, mismatches = self.broker.ensure_stream(spec, self.generation)
        name = stream_name_for(spec.channel.flow, spec.channel.run, spec.channel.node)
        return VerifiedChannel(spec=spec, name=name, created=created, mismatches=mismatches)

    def ensure_subscription(
        self, spec: SubscriptionSpec, operation_id: str
    ) -> VerifiedSubscription:
        """Bind the durable and start receiving for it. Repeating the same operation_id
        returns the same binding; a new operation_id rebinds, raising the generation so
        every token of the earlier binding is stale (MSG-011) and handing its parked
        deliveries back. A durable keeps the configuration it was created with; a
        different request (credit: MSG-017) is reported in mismatches.

        Raises:
            BrokerUnavailable: not started.
            UnobservableState: the channel does not exist (reason 'missing'): the
                durable lives on its channel's stream, so there is nothing to bind to.
        """
        self._require_connected()
        binding = self._bindings.get(spec.id)
        if binding is not None and binding.operation_id == operation_id:
            return binding.verified
        answer = self.broker.ensure_durable(replace(spec, id=self._wire(spec.id)))
        if answer is None:
            raise UnobservableState(f"no channel {spec.id.channel!r} to bind {spec.id!r} to",
                                    reason="missing")
        created, mismatches = answer
        if binding is not None:
            with self.broker.lock:
                for delivery in binding.parked:
                    self.broker.nak(self._wire(spec.id), delivery.stream_seq,
                                    delivery.num_delivered, 0.0)
                # Handed-out deliveries of the old binding are stale from here on
                # (MSG-011): nothing of theirs can be settled, so none is held; their
                # leases lapse at the broker as they would for a rebound JetStream
                # consumer.
                for token in [t for t in self._held if t.subscription == spec.id]:
                    del self._held[token]
        generation = self._generations.get(spec.id, -1) + 1
        self._generations[spec.id] = generation
        verified = VerifiedSubscription(
            spec=spec, name=self._durable_name(spec.id), generation=generation,
            created=created, mismatches=mismatches,
        )
        new = _Binding(spec=spec, verified=verified, operation_id=operation_id)
        if binding is not None:
            new.admit, new.on_skip, new.skipped = binding.admit, binding.on_skip, binding.skipped
        elif spec.id in self._admission:  # set before the first bind
            new.admit, new.on_skip = self._admission[spec.id]
        self._bindings[spec.id] = new
        return verified

    def _wire(self, sub: SubscriptionId) -> SubscriptionId:
        """The broker-side durable a subscription binds. An EOS subscription is this
        receiver's own, as on JetStream (one EOS durable per process): every replica of
        a consumer must see every end marker, where data is shared among them."""
        if sub.kind != "eos":
            return sub
        return SubscriptionId(f"{sub.consumer}~{self.instance_id}", sub.channel, "eos")

    @staticmethod
    def _durable_name(sub: SubscriptionId) -> str:
        parent = sub.channel.node
        if sub.kind == "eos":
            return f"{sub.consumer}--eos--{parent}"
        name = f"{sub.consumer}--from--{parent}"
        return name if sub.replica is None else f"{name}--p{sub.replica}"

    def subscribe_control(self, callback: Callable[[], None]) -> None:
        """callback runs on this backend's loop when MemoryBroker.publish_stop is called
        for this backend's flow and run."""
        loop = self.loop

        def notify() -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(callback)

        self._control.append(notify)
        self.broker.subscribe_control(self.flow_id, self.run_id, notify)

    # ------------------------------------------------------------------ publishing

    def lose_next_receipts(self, count: int = 1, stored: bool = True) -> None:
        """Fault injection for tests: the next count publishes answer PublicationUnknown
        — after storing the message (stored=True) or without it reaching the broker."""
        if stored:
            self._lose_receipts += count
        else:
            self._drop_sends += count

    def publish(self, envelope: Envelope, deadline: float) -> PublishOutcome:
        """Publish synchronously. The in-process broker always answers at once, so a
        deadline cannot expire after the send; PublicationUnknown comes only from
        lose_next_receipts. A backend not started answers Rejected (retryable): nothing
        was sent."""
        if not self._connected:
            return Rejected("the memory backend is not connected", retryable=True)
        if envelope.msg_id is not None:
            sent_at = self.broker.clock()
            # First sends in order, so what left the window is at the front: pruned
            # one by one, never by rebuilding a map that is mostly still in the window.
            times = self._publish_times
            window = self.broker.duplicate_window
            while len(times) > _PUBLISH_TIMES_PRUNE_AT:
                _, oldest = next(iter(times.items()))
                if sent_at - oldest < window:
                    break
                times.popitem(last=False)
            times.setdefault((envelope.channel, envelope.msg_id), sent_at)
        if self._drop_sends:
            self._drop_sends -= 1
            return PublicationUnknown("receipt lost (injected); the send never arrived")
        outcome = self.broker.publish(envelope)
        if self._lose_receipts and isinstance(outcome, Accepted):
            self._lose_receipts -= 1
            return PublicationUnknown("receipt lost (injected)")
        return outcome

    def observe_publication(self, envelope: Envelope) -> PublishOutcome:
        """Without a msg_id nothing can be deduplicated, so nothing can be known; with
        one, the re-publish is idempotent while the first send is inside the window."""
        if envelope.msg_id is None:
            return PublicationUnresolvable("no msg_id: a re-publish could duplicate")
        if not self._connected:
            return Rejected("the memory backend is not connected", retryable=True)
        first = self._publish_times.get((envelope.channel, envelope.msg_id))
        now = self.broker.clock()
        if first is not None and now - first >= self.broker.duplicate_window:
            return PublicationUnresolvable("the first send is outside the duplicate window")
        outcome = self.broker.publish(envelope)
        if isinstance(outcome, Accepted):
            self._publish_times.pop((envelope.channel, envelope.msg_id), None)
        return outcome

    # ------------------------------------------------------------------- receiving

    def _fill(self, sub: SubscriptionId, skipped: list[tuple[Callable[[Delivery], None],
                                                              Delivery]]) -> None:
        """Prefetch into the subscription's parked queue, under the broker's lock."""
        binding = self._bindings.get(sub)
        if binding is None or not self._receiving:
            return
        generation = binding.verified.generation
        while len(binding.parked) < self.prefetch:
            if self.byte_budget is not None and self.resident_bytes() >= self.byte_budget:
                self._budget_waits += 1  # RUN-025
                return
            if binding.spec.byte_credit and self._sub_bytes(sub) >= binding.spec.byte_credit:
                return
            fetched = self.broker.fetch(self._wire(sub))
            if fetched is None:
                return
            seq, attempt, data, traceparent = fetched
            delivery = trusted_delivery(sub, seq, attempt, generation, data, traceparent)
            # MSG-011: a redelivery supersedes any earlier attempt this receiver holds.
            for old in [t for t in self._held if t.subscription == sub and t.stream_seq == seq]:
                del self._held[old]
                binding.parked = deque(d for d in binding.parked if d.token != old)
            if binding.admit is not None and not binding.admit(delivery):
                if self.broker.ack(self._wire(sub), seq, attempt, terminal=False) == "ok":
                    binding.skipped += 1
                    self.broker.add_dropped(self._wire(sub))
                    if binding.on_skip is not None:
                        skipped.append((binding.on_skip, delivery))
                continue
            binding.parked.append(delivery)
            self._held[delivery.token] = delivery

    def _sub_bytes(self, sub: SubscriptionId) -> int:
        return sum(d.size for t, d in self._held.items() if t.subscription == sub)

    def _take(self, subscriptions: Sequence[SubscriptionId], item_credit: int,
              byte_credit: int) -> list[tuple[SubscriptionId, Delivery]]:
        taken: list[tuple[SubscriptionId, Delivery]] = []
        skipped: list[tuple[Callable[[Delivery], None], Delivery]] = []
        size = 0
        with self.broker.lock:
            for sub in subscriptions:
                self._fill(sub, skipped)
            progress = True
            while progress and len(taken) < item_credit:
                progress = False
                for sub in subscriptions:  # round robin, so no subscription starves
                    binding = self._bindings.get(sub)
                    if binding is None or not binding.parked or len(taken) >= item_credit:
                        continue
                    nxt = binding.parked[0]
                    if not self.broker.is_current(self._wire(sub), nxt.stream_seq,
                                                  nxt.num_delivered):
                        # Its lease lapsed while parked and the broker redelivered it
                        # (or it left the channel): handing it out would be a stale
                        # token for work that is someone else's now (MSG-011).
                        binding.parked.popleft()
                        self._held.pop(nxt.token, None)
                        progress = True
                        continue
                    if taken and byte_credit and size + nxt.size > byte_credit:
                        continue
                    binding.parked.popleft()
                    taken.append((sub, nxt))
                    size += nxt.size
                    progress = True
            for sub in subscriptions:  # top the parked queues up again
                self._fill(sub, skipped)
        for on_skip, delivery in skipped:  # off the broker's lock
            on_skip(delivery)
        return taken

    def receive_any(
        self,
        subscriptions: Sequence[SubscriptionId],
        item_credit: int,
        byte_credit: int,
        deadline: float,
    ) -> list[tuple[SubscriptionId, Delivery]]:
        """Everything dequeued is returned. The deadline is real monotonic time; the
        leases are on the broker's clock, re-applied every wait slice."""
        if item_credit < 1:
            return []
        while True:
            taken = self._take(subscriptions, item_credit, byte_credit)
            remaining = deadline - clock.monotonic()
            if taken or remaining <= 0 or not self._receiving:
                return taken
            with self.broker.condition:
                self.broker.condition.wait(timeout=min(remaining, _WAIT_SLICE_SECONDS))

    def set_admission(
        self,
        subscription: SubscriptionId,
        admit: Callable[[Delivery], bool],
        on_skip: Callable[[Delivery], None] | None = None,
    ) -> bool:
        """Kept for the subscription, bound or not yet bound, so a filter set before
        the bind applies from the first delivery (the filter runs when a delivery is
        fetched, under the broker's lock; on_skip runs on the receiving caller's thread
        after the lock is released). Returns True."""
        self._admission[subscription] = (admit, on_skip)
        binding = self._bindings.get(subscription)
        if binding is not None:
            binding.admit, binding.on_skip = admit, on_skip
        return True

    def prefetched(self, subscription: SubscriptionId) -> int:
        binding = self._bindings.get(subscription)
        return 0 if binding is None else len(binding.parked)

    def skipped(self, subscription: SubscriptionId) -> int:
        binding = self._bindings.get(subscription)
        return 0 if binding is None else binding.skipped

    def backlog(self, subscription: SubscriptionId) -> Known[int] | Unknown:
        """Parked deliveries plus what the broker holds available for the durable."""
        binding = self._bindings.get(subscription)
        if binding is None:
            return Unknown("unread", f"{subscription!r} is not bound here")
        observation = self.broker.observe_durable(self._wire(subscription))
        if observation is None:
            return Unknown("missing", f"no subscription {subscription!r}")
        return Known(len(binding.parked) + observation.available)

    def resident_bytes(self) -> int:
        with self.broker.lock:
            return sum(d.size for d in self._held.values())

    def budget_waits(self) -> int:
        return self._budget_waits

    # ------------------------------------------------------------------ settlement

    def _live(self, token: DeliveryToken) -> bool:
        binding = self._bindings.get(token.subscription)
        return (token in self._held and binding is not None
                and binding.verified.generation == token.generation)

    def settle(
        self, token: DeliveryToken, outcome: SettleOutcome, settlement_id: str
    ) -> SettleResult:
        """The broker answers in-process, so a live token settles SettleConfirmed; this
        adapter never reports SettleUnknown. A token this receiver does not hold (handed
        back, superseded, from an earlier binding or another receiver) or whose message
        was redelivered since is SettleStale, and so is one whose message left the
        channel (evicted or deleted): nothing more can be settled for it."""
        previous = self._settlements.get(settlement_id)
        if previous is not None and previous[0] == token:
            return previous[1]
        with self.broker.lock:
            if not self._live(token):
                self._held.pop(token, None)
                return SettleStale("not a live delivery of this receiver (superseded, "
                                   "handed back or from an earlier binding)")
            sub, seq, attempt = self._wire(token.subscription), token.stream_seq, token.attempt
            answer: BrokerAnswer
            if isinstance(outcome, Completed):
                answer = self.broker.ack(sub, seq, attempt, terminal=False)
            elif isinstance(outcome, Terminal):  # DELIV-15: the type carries record_ref
                answer = self.broker.ack(sub, seq, attempt, terminal=True)
            elif isinstance(outcome, Retry):
                answer = self.broker.nak(sub, seq, attempt, outcome.delay)
            else:
                raise TypeError(f"not a settle outcome: {outcome!r}")
            del self._held[token]
        result: SettleResult
        if answer == "ok":
            result = SettleConfirmed()
        elif answer == "stale":
            result = SettleStale("a newer attempt of this message was delivered")
        else:
            result = SettleStale("the message is no longer in the channel")
        self._settlements[settlement_id] = (token, result)
        return result

    def renew(self, token: DeliveryToken) -> LeaseObservation:
        with self.broker.lock:
            if not self._live(token):
                return LeaseObservation("stale", "not a live delivery of this receiver")
            answer = self.broker.renew(self._wire(token.subscription), token.stream_seq,
                                       token.attempt)
        if answer == "ok":
            return LeaseObservation("extended")
        self._held.pop(token, None)
        return LeaseObservation("stale", f"the broker no longer leases it ({answer})")

    def supersede(self, token: DeliveryToken) -> bool:
        with self.broker.lock:
            live = self._live(token)
            self._held.pop(token, None)
            return live

    def mark_exhausted(self, subscription: SubscriptionId, stream_sequence: int | None) -> None:
        """stream_sequence None (the ledger does not know it) counts one anonymous
        unresolved message, cleared by the next Terminal settlement of the subscription
        that matches no marked sequence."""
        self.broker.mark_exhausted(self._wire(subscription), stream_sequence)

    # ---------------------------------------------------------------- observations

    def observe_channel(self, channel: ChannelId) -> Known[ChannelObservation] | Unknown:
        observation = self.broker.observe_channel(channel)
        if observation is None:
            return Unknown("missing", f"no channel {channel!r}")
        return Known(observation)

    def observe_subscription(
        self, subscription: SubscriptionId
    ) -> Known[SubscriptionObservation] | Unknown:
        observation = self.broker.observe_durable(self._wire(subscription))
        if observation is None:
            return Unknown("missing", f"no subscription {subscription!r}")
        return Known(observation)

    def observe_ack_floor(self, subscription: SubscriptionId) -> Known[int] | Unknown:
        floor = self.broker.ack_floor(self._wire(subscription))
        if floor is None:
            return Unknown("missing", f"no subscription {subscription!r}")
        return Known(floor)
