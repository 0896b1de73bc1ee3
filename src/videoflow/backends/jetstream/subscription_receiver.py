"""Receiving one subscription on JetStream: SubscriptionReceiver, a binding's pull
loop, which keeps pull requests open and parks what the server delivers into a bounded
local prefetch queue; how a binding is made (bind_receiver); and taking from several
bindings fairly (take_round_robin).

A SubscriptionReceiver is created, driven and stopped on the adapter's own loop. It owns
two parts, each in a module beside this one: its PrefetchQueue (jetstream.prefetch_queue:
the parked deliveries and the live ones) and its DeliveryLeases
(jetstream.delivery_leases: the fenced settlement of every token it hands out and the
leases it keeps alive: MSG-011, PAY-004, DELIV-15).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Final

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from videoflow.backends.jetstream.delivery_leases import DeliveryLeases, HeldDelivery
from videoflow.backends.jetstream.outcomes import TRACEPARENT_HEADER
from videoflow.backends.jetstream.prefetch_queue import PrefetchQueue
from videoflow.backends.jetstream.reply_inbox import ReplyMux, subscribe_inline
from videoflow.backends.messaging import Delivery, SubscriptionId
from videoflow.backends.messaging_types import trusted_delivery
from videoflow.errors import BrokerUnavailable

logger = logging.getLogger(__name__)

ACK_CONFIRM_SECONDS: Final = 2.0
"""How long a Completed settlement waits for the server's ack reply before it is
reported SettleUnknown (Msg.ack_sync(timeout), nats-py 2.15.0)."""

FETCH_TIMEOUT_SECONDS: Final = 1.0
"""How long one pull request waits for a message before the loop re-checks whether it
should stop. Also the unit receive_any waits in."""

ATTEMPTS_KEPT: Final = 4096
"""Messages whose latest attempt a binding remembers (SubscriptionReceiver.attempt_of):
as many as the settlements its DeliveryLeases remembers by id."""


def delivery_position(msg: Msg) -> tuple[int, int, int]:
    """(stream sequence, delivery count, messages still pending for the consumer) of a
    JetStream delivery, read from its reply subject by the token positions nats-py's
    Msg.Metadata._from_reply uses ($JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.
    <cseq>.<ts>.<pending> for 9 tokens, and the domain form with delivered at 6 and
    pending at 10 for 11 or more). Msg.metadata builds three dataclasses and a
    datetime per message, several times the cost of this; anything unexpected goes to
    it, which raises on a reply that is not JetStream's.

    Raises:
        ValueError / NotJSMessageError: the reply is not a JetStream delivery's, or its
            stream sequence or delivery count is 0.
    """
    tokens: list[str] = msg.reply.split(".") if msg.reply else []
    if len(tokens) >= 9 and tokens[0] == "$JS" and tokens[1] == "ACK":
        at = 4 if len(tokens) == 9 else 6
        delivered, seq, pending = tokens[at], tokens[at + 1], tokens[at + 4]
        if (delivered.isdigit() and seq.isdigit() and pending.isdigit()
                and len(tokens) != 10):
            position = int(seq), int(delivered), int(pending)
            if position[0] and position[1]:
                return position
    meta = msg.metadata
    if not (meta.sequence.stream >= 1 and meta.num_delivered >= 1):
        # A delivery is built from these unchecked (trusted_delivery).
        raise ValueError(f"a delivery without a stream sequence and count: {msg.reply!r}")
    return meta.sequence.stream, meta.num_delivered, meta.num_pending


_JS_API: Final = "$JS.API"
"""The JetStream API prefix (nats-py's default; no domain or custom prefix)."""

PARK_BYTES: Final = 4 * 1024 * 1024
"""About the most envelope bytes one binding asks the server for ahead of its task: the
prefetch depth shrinks to fit deliveries of the size seen so far. A deep prefetch of
camera frames had every binding of a join ask for tens of MB at once, which overran the
server's buffer for the connection (a slow consumer, disconnected)."""

_FIRST_DEPTH: Final = 4
"""The depth asked for before any delivery's size is known."""

_AWAY_POLL_SECONDS: Final = 0.05
"""How often a pull loop looks whether a broker that went away is back."""

_PULL_GRACE_SECONDS: Final = 1.0
"""How long past its expiry a pull request is still counted, waiting for its 408."""


class PullRefused(Exception):
    """A pull request the server ended with a refusal status (409, 503)."""

    def __init__(self, status: str, description: str) -> None:
        super().__init__(f"pull request refused: {status} {description}".rstrip())
        self.status, self.description = status, description


@dataclass(slots=True)
class _Pull:
    remaining: int
    expires_at: float


class SubscriptionReceiver:
    """One binding of a subscription: a pull loop that prefetches into a bounded local
    queue (queue, a PrefetchQueue: the parked deliveries and the live ones), handing
    them out, and back to the broker; settling them and keeping their leases is its
    leases' (a DeliveryLeases over the queue's live deliveries).

    A delivery is live while its token is the newest attempt of its stream sequence
    this binding fetched; a redelivery, a rebind (a new generation) or a settlement
    makes it stale, and settling or renewing a stale token sends nothing (MSG-011).

    Arguments:
        subscription: which subscription this binds.
        client: the connection.
        stream / durable: the existing durable this binds (created and read back by
            ensure_durable beforehand: binding never creates or alters it, NATS_FACTS
            S5).
        generation: this binding's generation; every token carries it.
        prefetch: the most deliveries parked locally (fetched, not handed out).
        fetch_timeout: seconds one pull request waits.
        ack_confirm_seconds: how long a settlement waits for the server's reply.
        byte_credit: the most unsettled envelope bytes this binding holds before its
            loop pauses (the subscription's byte_credit; 0: unbounded).
        may_fetch: the backend-wide byte budget's gate (RUN-025), None without one:
            while it answers False the loop pauses, counting each pause in
            budget_waits. With a budget (this or byte_credit) the loop asks for one
            message at a time, so the one in flight when the budget fills is all that
            can exceed it.
        replies: the connection's settlement reply inbox, shared by its bindings; None
            makes one for this binding.
    """

    def __init__(
        self,
        subscription: SubscriptionId,
        client: Client,
        stream: str,
        durable: str,
        generation: int,
        prefetch: int = 4,
        fetch_timeout: float = FETCH_TIMEOUT_SECONDS,
        ack_confirm_seconds: float = ACK_CONFIRM_SECONDS,
        byte_credit: int = 0,
        may_fetch: Callable[[], bool] | None = None,
        replies: ReplyMux | None = None,
        on_parked: Callable[[], None] | None = None,
    ) -> None:
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"prefetch must be an int >= 1, got {prefetch!r}")
        self.subscription = subscription
        self.client = client
        self.stream, self.durable = stream, durable
        self.generation = generation
        self.prefetch = prefetch
        self.fetch_timeout = fetch_timeout
        self.ack_confirm_seconds = ack_confirm_seconds
        self.replies = replies if replies is not None else ReplyMux(client)
        # The caller's thread takes parked deliveries itself (take_ready): the queue's
        # lock covers them, and whether the pull loop waits for room (_space_waiting).
        self.queue = PrefetchQueue()
        self.leases = DeliveryLeases(subscription, generation, client, self.replies,
                                     ack_confirm_seconds, self.queue.held)
        self._space_waiting = False
        self.on_parked = on_parked  # called on the loop after each delivery is parked
        self._loop: asyncio.AbstractEventLoop | None = None
        self._space = asyncio.Event()  # set whenever the pull loop should look again
        self._space.set()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._handed_back = False
        self._inbox = ""
        self._inbox_sub: Any = None
        self._pulls: dict[str, _Pull] = {}
        self._pull_ids = itertools.count()
        self._refused_until = 0.0
        self.refusals = 0  # pull requests the server refused (409, 503)
        self.byte_credit = byte_credit
        self.may_fetch = may_fetch
        self.budget_waits = 0
        self.admit: Callable[[Delivery], bool] | None = None
        self.on_skip: Callable[[Delivery], None] | None = None
        self.skipped = 0
        self._tasks: set[asyncio.Task[None]] = set()  # skips and straggler naks
        self.last_error: BaseException | None = None
        self._mean_size = 0.0  # of the deliveries parked so far (depth)
        # The latest attempt handed out per stream sequence, oldest first (attempt_of).
        self._attempts: OrderedDict[int, int] = OrderedDict()
        self.wanted = prefetch  # set by the backend's set_receive_depth
        # How the caller's thread hands the pull loop its wake-up: the backend's
        # LoopRunner.call_soon (no self-pipe write when the caller runs the loop next
        # itself); None: the loop's call_soon_threadsafe.
        self.schedule: Callable[[Callable[[], Any]], None] | None = None

    # ------------------------------------------------------------------ pull loop

    async def subscribe(self) -> None:
        """Subscribe this binding's delivery inbox (before start). Every pull request
        names its own reply subject under it, which the server's closing status for
        that request (408, 409) is addressed to."""
        self._loop = asyncio.get_running_loop()
        if self._inbox_sub is None:
            inbox = self.client.new_inbox()
            self._inbox_sub = await subscribe_inline(self.client, inbox + ".*", self._on_message)
            self._inbox = inbox

    def start(self) -> None:
        """Start the pull loop (on the running loop, after subscribe). Idempotent."""
        if self._task is None and not self._stopping:
            self._task = asyncio.get_running_loop().create_task(
                self._pull_loop(), name=f"videoflow-pull-{self.subscription.consumer}")

    @property
    def receiving(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _pull_loop(self) -> None:
        """Keep pull requests open for what the prefetch queue has room for.

        nats-py's fetch is not used: it awaits every message of a batch through its own
        wait_for, several loop turns per message, and a fetch cancelled by a stop would
        leave its request open with nobody reading the inbox. Here the server delivers
        straight into this binding's inbox callback, which parks each message as it
        arrives; a request ends with its last message, or with the server's 408 when it
        expires (fetch_timeout), or a 409/503 refusal. A new request goes out when the
        room not yet asked for is at least half the prefetch, or nothing is asked for;
        under a byte budget, one message at a time.
        """
        while not self._stopping:
            if not self.client.is_connected:
                if self.client.is_closed:
                    return  # given up (the outage budget ran out) or shut down
                # The broker is away: a request now would only wait in the client's
                # buffer, and the one the outage ended is asked again on its return
                # (reconnected).
                await asyncio.sleep(_AWAY_POLL_SECONDS)
                continue
            self._forget_expired_pulls()
            hold = self._refused_until - time.monotonic()
            if hold > 0:
                # The last request was refused (a deleted consumer answers at once):
                # ask again a fetch later, not in a tight loop.
                await asyncio.sleep(hold)
                continue
            with self.queue.lock:  # so a take cannot slip between the count and the wait
                free = self._room_to_ask()
                if not free:
                    self._space.clear()
                    # A take that makes room enough to ask for wakes this loop.
                    self._space_waiting = True
            if free:
                if not self._budget_admits():
                    # RUN-025: hold off until settlements free bytes; looked at again
                    # every tenth of a fetch, since a settlement elsewhere notifies
                    # nobody here.
                    self.budget_waits += 1
                    while not self._stopping and not self._budget_admits():
                        await asyncio.sleep(self.fetch_timeout / 10)
                    continue
                try:
                    await self._request(free)
                except asyncio.CancelledError:
                    raise
                except nats.errors.Error as error:
                    self.last_error = error
                    await asyncio.sleep(self.fetch_timeout)  # do not spin on a dead link
                continue
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(self._space.wait(), self.fetch_timeout)
            self._space_waiting = False

    def reconnected(self) -> None:
        """The connection is back after an outage: the server forgot the pull requests
        open on the old one (a restarted server knows none, a reconnect to another
        server never had them), so none is counted any more and the loop asks at once.
        A request that did survive only delivers into the inbox as before. The
        latest confirmed acknowledgements are sent again (reack_recent: a restarted
        server may have lost them), and those the outage left unanswered too
        (reack_unknown). Called on the loop."""
        self._pulls.clear()
        self._refused_until = 0.0
        self._space.set()
        self._background(self._reack_quietly())

    async def _reack_quietly(self) -> None:
        with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
            await self.leases.reack_recent()
            if self.leases.unanswered():
                await self.leases.reack_unknown()

    def _room_to_ask(self) -> int:
        """How many deliveries a new pull request would ask for now, 0 when none should
        go out (the rule in _pull_loop's docstring). Called under the queue's lock, by the pull
        loop and by a take on the caller's thread, which wakes the loop only when
        this says it would ask: waking it for every take, to find nothing to ask for,
        cost a slow reader several loop turns per message. Pull requests whose expiry
        has passed do not count (the loop forgets them when it looks)."""
        now = time.monotonic()
        asked = sum(pull.remaining for pull in list(self._pulls.values())
                    if pull.expires_at > now)
        depth = self.depth()
        free = depth - len(self.queue.parked) - asked
        if self.byte_credit or self.may_fetch is not None:
            # Under a byte budget one message at a time, so what lands after the
            # budget filled is at most the one already asked for (RUN-025's
            # atomic-admission tolerance): sizes are not known before they arrive.
            free = min(free, 0 if asked else 1)
        return free if free > 0 and (not asked or 2 * free >= depth) else 0

    def depth(self) -> int:
        """How many deliveries to keep asked for or parked: the prefetch, or fewer once
        that many of the sizes seen so far would pass PARK_BYTES, and no more than the
        receiver wants (wanted: what its task gets through in a short while)."""
        if not self._mean_size:
            return min(self.prefetch, self.wanted, _FIRST_DEPTH)
        return max(1, min(self.prefetch, self.wanted, int(PARK_BYTES // self._mean_size)))

    async def _request(self, batch: int) -> None:
        reply = f"{self._inbox}.{next(self._pull_ids)}"
        # The request lingers up to expires (no no_wait): the server sends each message
        # as it becomes available, then a 408 if fewer than batch came (S10).
        expires = int(self.fetch_timeout * 1e9)
        self._pulls[reply] = _Pull(batch, time.monotonic() + self.fetch_timeout
                                   + _PULL_GRACE_SECONDS)
        try:
            await self.client.publish(
                f"{_JS_API}.CONSUMER.MSG.NEXT.{self.stream}.{self.durable}",
                json.dumps({"batch": batch, "expires": expires}).encode(), reply=reply)
        except nats.errors.Error:
            del self._pulls[reply]  # refused by the client: nothing was asked for
            raise
        # A cancellation (stop) keeps the entry: the request may be on the wire, and
        # stop must wait for it to end before anything is handed back.

    def _forget_expired_pulls(self) -> None:
        # A request whose closing status never came (a lost 408) stops counting once
        # its expiry has passed, so the loop asks again instead of waiting forever.
        now = time.monotonic()
        for reply, pull in list(self._pulls.items()):
            if pull.expires_at <= now:
                del self._pulls[reply]

    def _on_message(self, msg: Msg) -> None:
        """The inbox handler, inside the read loop (subscribe_inline): park a
        delivery, or end a request on its status. Never waits."""
        headers = msg.headers
        status = headers.get("Status") if headers else None
        if status is None:
            # A delivery carries the stream's subject, not the request's reply subject;
            # the server fills waiting requests first come, first served, so it counts
            # against the oldest one open.
            for reply, pull in self._pulls.items():
                pull.remaining -= 1
                if pull.remaining <= 0:
                    del self._pulls[reply]
                    self._space.set()
                break
            if self._handed_back:
                # A straggler after a hand-back (a request whose end never came): hand
                # it back too; no request of this binding is open to bounce it into.
                self._background(self._nak(msg))
                return
            self._park(msg)
            return
        if status == "100":  # an idle heartbeat; none is asked for, harmless if sent
            return
        self._pulls.pop(msg.subject, None)
        self._space.set()
        if status in ("404", "408"):
            # No messages, or the request expired short: the consumer had nothing more
            # it could deliver.
            self.queue.broker_pending = 0
        else:
            # 409 (consumer deleted, a request limit exceeded, ...) or 503 (no consumer
            # at all, S14): keep it for observation, and hold the next request off.
            self.refusals += 1
            self._refused_until = time.monotonic() + self.fetch_timeout
            self.last_error = PullRefused(status, headers.get("Description", "") if headers
                                          else "")

    def _budget_admits(self) -> bool:
        if self.byte_credit and self.queue.resident_bytes() >= self.byte_credit:
            return False
        return self.may_fetch is None or self.may_fetch()

    def attempt_of(self, seq: int, counted: int) -> int:
        """The attempt a delivery of message seq is handed out as: the broker's delivery
        count, or one more than the latest attempt this binding handed out for it when
        the count is not above that. A nats-server SIGKILLed and restarted on its store
        can have lost the latest deliveries and acks it had not yet written, and hands
        those messages out again with the same count (hundreds per restart, seen in
        test_broker_faults). Equal tokens would then name two deliveries: the second's
        settlement, under the same settlement id, was answered from the first's (sent
        nothing), or a supersede of the first retired the second, and the message stayed
        pending on the broker, renewed by the keepalive for good (a run that never
        ended). Remembered for the latest ATTEMPTS_KEPT messages; a redelivery still
        held here is always seen (its token is in the queue)."""
        attempts = self._attempts
        last = attempts.pop(seq, 0)
        held = self.queue.held.get(seq)
        if held is not None:
            last = max(last, held.delivery.token.attempt)
        attempt = counted if counted > last else last + 1
        attempts[seq] = attempt
        if len(attempts) > ATTEMPTS_KEPT:
            attempts.popitem(last=False)
        return attempt

    def _park(self, msg: Msg) -> None:
        seq, counted, pending = delivery_position(msg)
        attempt = self.attempt_of(seq, counted)
        # A status-less message's headers are its publisher's (Nats-Msg-Id, traceparent).
        headers = msg.headers
        delivery = trusted_delivery(self.subscription, seq, attempt, self.generation, msg.data,
                            headers.get(TRACEPARENT_HEADER) if headers else None)
        # A moving mean of the sizes, for depth(): recent sizes weigh most.
        size = delivery.size
        self._mean_size = size if not self._mean_size else 0.9 * self._mean_size + 0.1 * size
        queue = self.queue
        with queue.lock:
            old = queue.held.pop(seq, None)
            if old is not None and old.parked:
                # MSG-011: a redelivery supersedes the earlier attempt parked here.
                with contextlib.suppress(ValueError):
                    queue.parked.remove(old.delivery)
        if self.admit is not None and not self.admit(delivery):
            queue.broker_pending = pending
            self._background(self._skip(delivery, msg))
            return
        with queue.lock:  # with the count, so backlog never misses the one in between
            queue.held[seq] = HeldDelivery(delivery, msg)
            queue.parked.append(delivery)
            queue.broker_pending = pending
        if self.on_parked is not None:
            self.on_parked()

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _nak(msg: Msg) -> None:
        with contextlib.suppress(nats.errors.Error):
            await msg.nak()

    async def _skip(self, delivery: Delivery, msg: Msg) -> None:
        """Settle a delivery the admission filter refused Completed on the consumer's
        behalf and, once the server confirmed it, hand it to on_skip on a worker thread
        (never the loop: on_skip may block). An unconfirmed ack is left to ack_wait."""
        try:
            await msg.ack_sync(timeout=self.ack_confirm_seconds)
        except asyncio.CancelledError:
            raise
        except nats.errors.Error as error:
            logger.warning("admission skip of seq %d on %s not confirmed: %s",
                           delivery.stream_seq, self.subscription.consumer, error)
            return
        self.skipped += 1
        if self.on_skip is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.on_skip, delivery)

    @property
    def parked(self) -> int:
        """Deliveries fetched and parked, not yet handed out."""
        return len(self.queue.parked)

    def take_ready(self, item_credit: int, byte_credit: int = 0) -> list[Delivery]:
        """Hand out up to item_credit parked deliveries without waiting (and about
        byte_credit bytes, 0 = unbounded: the first always goes). Safe from any
        thread: the caller's takes them straight off the queue the loop parks into,
        with no round trip through the loop; the pull loop is woken (one call onto
        the loop) only when it waits for room and this take made enough to ask for
        more (_room_to_ask)."""
        taken: list[Delivery] = []
        size = 0
        queue = self.queue
        with queue.lock:
            # The take itself is written out here, not a call into the queue: with
            # several bindings, take_round_robin calls this once per delivery.
            parked, held_of = queue.parked, queue.held
            while parked and len(taken) < item_credit:
                delivery = parked[0]
                if byte_credit and taken and size + delivery.size > byte_credit:
                    break
                parked.popleft()
                held = held_of.get(delivery.stream_seq)
                if held is None or held.delivery is not delivery:
                    continue  # superseded while parked
                held.parked = False
                taken.append(delivery)
                size += delivery.size
            wake = bool(taken) and self._space_waiting and self._room_to_ask() > 0
            if wake:
                self._space_waiting = False
        if wake:
            self._wake_pull_loop()
        return taken

    def _wake_pull_loop(self) -> None:
        loop = self._loop
        if loop is not None:
            # A closed or stopped loop: nobody to wake.
            with contextlib.suppress(RuntimeError, BrokerUnavailable):
                (self.schedule or loop.call_soon_threadsafe)(self._space.set)

    async def hand_back(self, parked_only: bool) -> int:
        """NAK deliveries back to the broker at once (RUN-030) so a survivor gets them
        now, not after ack_wait: the parked ones, or every live one. A fire-and-forget
        nak (Msg.nak) is enough — the worst case is the lease lapsing as it would have.

        Returns:
            how many were handed back.
        """
        self._handed_back = True
        handed = 0
        for held in self.queue.withdraw(parked_only):
            with contextlib.suppress(nats.errors.Error):
                await held.msg.nak()  # MsgAlreadyAckdError: settled elsewhere; leave it
                handed += 1
        self._space.set()
        return handed

    async def stop(self) -> None:
        """Stop the pull loop and withdraw the delivery inbox (_withdraw): what the
        requests still open on the server had sent is parked by the time this returns,
        and nothing more arrives. Parked deliveries stay parked; hand_back returns
        them, and no request of this binding is left for the server to redeliver a
        NAKed one straight into, instead of to a survivor (RUN-030)."""
        task, self._task = self._task, None
        self._stopping = True
        self.leases.stopping = True
        self._space.set()
        if task is not None:
            task.cancel()  # it only ever waits; requests already sent end in _withdraw
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._withdraw()
        await self.leases.stop_keep_alive()

    async def _withdraw(self) -> None:
        """Drop the inbox's interest and take in what is already on its way to it: an
        UNSUB and a flush's round trip (Subscription.drain), after which every delivery
        the server sent into this binding's open requests has been parked, inline in
        the read loop, and none can follow. The server hands a waiting pull request
        nothing once its reply subject has no subscriber: it drops the request and
        keeps the message for the next one (checked on nats-server 2.15.1, for an
        unsubscribed inbox and a closed connection alike). Waiting for the open
        requests to end instead (their 408 at expiry) held every node's shutdown for up
        to fetch_timeout. Idempotent; the durable stays."""
        sub, self._inbox_sub = self._inbox_sub, None
        if sub is None:
            return
        try:
            await asyncio.wait_for(sub.drain(), self.fetch_timeout + _PULL_GRACE_SECONDS)
        except (nats.errors.Error, asyncio.TimeoutError, TimeoutError):
            # Closed, draining or frozen: whatever is still on its way stays leased
            # until ack_wait, as after a crash; the client's own record of it goes.
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        self._pulls.clear()  # the server dropped them with the interest


    async def unsubscribe(self) -> None:
        """Withdraw the delivery inbox (the durable stays): stop does it too."""
        await self._withdraw()


def take_round_robin(
    receivers: Sequence[tuple[SubscriptionId, SubscriptionReceiver]],
    item_credit: int,
    byte_credit: int,
) -> list[tuple[SubscriptionId, Delivery]]:
    """Take up to item_credit parked deliveries (and about byte_credit bytes, 0 =
    unbounded; the first always goes) round robin, one per receiver per round, so no
    subscription starves, and from each no more than it had parked when the take began.
    Never waits; safe from any thread (take_ready)."""
    if len(receivers) == 1:  # nothing to share fairly: take the batch in one go
        sub, receiver = receivers[0]
        return [(sub, d) for d in receiver.take_ready(item_credit, byte_credit)]
    # The keeper thread may run the loop meanwhile: each take wakes a pull loop that
    # asks again, and what that brings is parked while these rounds go on. Taken too,
    # a slow caller descheduled mid-take leased a delivery per round trip, far past
    # the depth its receivers keep (a 0.2 s-a-message sink held 7).
    left = [receiver.parked for _, receiver in receivers]
    taken: list[tuple[SubscriptionId, Delivery]] = []
    size, progress = 0, True
    while progress and len(taken) < item_credit:
        progress = False
        for index, (sub, receiver) in enumerate(receivers):
            if len(taken) >= item_credit:
                break
            if byte_credit and taken and size >= byte_credit:
                return taken
            if not left[index]:
                continue
            left[index] -= 1
            room = byte_credit - size if byte_credit and taken else 0
            for delivery in receiver.take_ready(1, room):
                if taken and byte_credit and size + delivery.size > byte_credit:
                    # take_ready hands out a first delivery regardless of room.
                    receiver.queue.put_back(delivery)
                    return taken
                taken.append((sub, delivery))
                size += delivery.size
                progress = True
    return taken


async def bind_receiver(
    client: Client,
    subscription: SubscriptionId,
    stream: str,
    durable: str,
    generation: int,
    prefetch: int = 4,
    fetch_timeout: float = FETCH_TIMEOUT_SECONDS,
    ack_confirm_seconds: float = ACK_CONFIRM_SECONDS,
    byte_credit: int = 0,
    may_fetch: Callable[[], bool] | None = None,
    admit: Callable[[Delivery], bool] | None = None,
    on_skip: Callable[[Delivery], None] | None = None,
    replies: ReplyMux | None = None,
    on_parked: Callable[[], None] | None = None,
) -> SubscriptionReceiver:
    """Bind an existing durable (provisioned with ensure_consumer) and start its pull
    loop. Nothing here creates or alters the durable, unlike pull_subscribe, which
    silently ignores a config when the durable exists (S5)."""
    receiver = SubscriptionReceiver(subscription, client, stream, durable, generation,
                                    prefetch, fetch_timeout, ack_confirm_seconds, byte_credit,
                                    may_fetch, replies, on_parked)
    receiver.admit, receiver.on_skip = admit, on_skip
    await receiver.subscribe()
    receiver.start()
    return receiver


__all__ = [
    "ACK_CONFIRM_SECONDS",
    "FETCH_TIMEOUT_SECONDS",
    "SubscriptionReceiver",
    "bind_receiver",
    "take_round_robin",
]
