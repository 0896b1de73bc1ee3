"""Receiving on JetStream across bindings: Receiver, the part of
JetStreamMessagingBackend that takes parked deliveries from its bindings round robin
on the caller's thread (receive_any), runs the loop while it waits for one, keeps the
byte budget (RUN-025) and each binding's admission filter and receive depth, stops
receiving (RUN-030), and reports what is parked, skipped and waiting.

One binding's pull loop is jetstream.subscription_receiver's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence

from videoflow.backends.jetstream.bindings import Bindings, stop_all
from videoflow.backends.jetstream.connection import BROKER_CALL_SECONDS, Connection
from videoflow.backends.jetstream.subscription_receiver import take_round_robin
from videoflow.backends.messaging import (
    BrokerUnavailable,
    Delivery,
    Known,
    SubscriptionId,
    Unknown,
)
from videoflow.broker.loop import COALESCE_SECONDS, Pacing


class Receiver:
    """Deliveries handed to the caller, and the bounds on what is held for it
    (receive_any, catch_up, set_admission, set_receive_depth, prefetched, skipped,
    backlog, resident_bytes, budget_waits, stop_receiving).

    Arguments:
        connection: the loop a wait runs, and the outage that ends receiving.
        bindings: the bindings received from.
        prefetch: the most deliveries a binding parks (the receive depth's ceiling).
        fetch_timeout: seconds one pull request waits (bounds stop_receiving).
        byte_budget: the most envelope bytes held unsettled before the pull loops
            pause (RUN-025); None: unbounded.

    Attributes:
        wanted: the receive depth each binding parks (set_receive_depth).
        stopped: stop_receiving was called (a binding made after it does not fetch).
    """

    def __init__(self, connection: Connection, bindings: Bindings, prefetch: int,
                 fetch_timeout: float, byte_budget: int | None) -> None:
        self.connection, self.bindings = connection, bindings
        self.prefetch, self.fetch_timeout = prefetch, fetch_timeout
        self.byte_budget = byte_budget
        self.wanted = prefetch
        self.stopped = False
        # Rung on the loop by every binding as it parks a delivery; receive_any waits
        # on it only while another thread runs the loop (it runs the loop otherwise).
        self._arrivals = threading.Condition(threading.Lock())
        self._arrived = 0
        self._ring_scheduled = False
        self._pacing = Pacing()  # of the callers of catch_up
        connection.on_reads_parsed = self.reads_parsed

    def budget_admits(self) -> bool:
        """Whether the byte budget has room (every pull loop's gate, on the loop)."""
        return self.byte_budget is None or self.resident_bytes() < self.byte_budget

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
        (ring): a delivery is read, parked and taken on one thread, with no wake-up
        between threads.

        Raises:
            BrokerUnavailable: the backend's loop is not running, or its broker was
                away for longer than the outage budget (nothing more can arrive).
        """
        connection = self.connection
        if connection.outage.given_up is not None:
            raise BrokerUnavailable(connection.outage.given_up)
        bound = self.bindings.bound
        receivers = [(s, bound[s].receiver) for s in subscriptions if s in bound]
        if item_credit < 1 or not receivers:
            return []
        arrivals, runner = self._arrivals, connection.runner
        if not runner.running:
            raise BrokerUnavailable("the JetStream backend's loop is not running")
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
        one write per COALESCE_SECONDS for a caller in a burst (Pacing) unless
        at_once; a paced caller's go out at once."""
        runner = self.connection.runner
        if not runner.running:
            return
        burst = self._pacing.back(time.monotonic(), runner.rested_since)
        try:
            runner.turn(COALESCE_SECONDS if burst and not at_once else 0.0)
        finally:
            self._pacing.left(time.monotonic())

    def ring(self) -> None:
        """On the loop: a binding parked a delivery (each binding's on_parked)."""
        # On the loop, for each delivery parked. The waiter is woken once the read loop
        # has parked everything the bytes just read held, not once per delivery: a
        # wake-up per delivery handed the interpreter back and forth per message.
        if not self._ring_scheduled:
            self._ring_scheduled = True
            # Parsed inline, the read's end rings it (reads_parsed), on this pass.
            if not getattr(self.connection.client, "parsing_inline", False):
                asyncio.get_running_loop().call_soon(self._ring_now)

    def reads_parsed(self) -> None:
        """On the loop: the bytes of a read have been parsed and every delivery they
        held parked, so a ring due on the loop's next pass is rung now: the waiter
        takes them a pass sooner."""
        if self._ring_scheduled:
            self._ring_now()

    def _ring_now(self) -> None:
        self._ring_scheduled = False
        with self._arrivals:
            self._arrived += 1
            self._arrivals.notify_all()
        self.connection.runner.poke()  # a receive_any running the loop on its own thread

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
        self.bindings.admission[subscription] = (admit, on_skip)
        binding = self.bindings.bound.get(subscription)
        if binding is not None:
            binding.receiver.admit, binding.receiver.on_skip = admit, on_skip
        return True

    def set_receive_depth(self, depth: int) -> None:
        """Park at most depth deliveries per subscription (never more than prefetch):
        a slow node that parks a deep prefetch holds inputs a competing replica could
        be processing, and has more to hand back when it leaves."""
        self.wanted = max(1, min(self.prefetch, depth))
        for receiver in self.bindings.receivers():
            receiver.wanted = self.wanted

    def prefetched(self, subscription: SubscriptionId) -> int:
        binding = self.bindings.bound.get(subscription)
        return 0 if binding is None else binding.receiver.parked

    def skipped(self, subscription: SubscriptionId) -> int:
        binding = self.bindings.bound.get(subscription)
        return 0 if binding is None else binding.receiver.skipped

    def backlog(self, subscription: SubscriptionId) -> Known[int] | Unknown:
        """Parked deliveries plus the broker's num_pending as the latest delivery's reply
        subject carried it (0 once a fetch ended short: 404/408); no round trip."""
        binding = self.bindings.bound.get(subscription)
        waiting = None if binding is None else binding.receiver.queue.backlog()
        if waiting is None:
            return Unknown("unread", f"nothing received for {subscription.consumer} yet")
        return Known(waiting)

    def resident_bytes(self) -> int:
        """Envelope bytes this receiver holds unsettled right now (parked or handed
        out)."""
        # Called from the loop thread (the pull loops' gate) and the caller's: the
        # bindings are copied first.
        return sum(receiver.queue.resident_bytes() for receiver in self.bindings.receivers())

    def budget_waits(self) -> int:
        """How many times a pull loop paused because the byte budget was full."""
        return self.bindings.retired_budget_waits + sum(
            receiver.budget_waits for receiver in self.bindings.receivers())

    def stop_receiving(self) -> int:
        """Stop admitting input on every bound subscription — the quiesce half of a
        graceful retirement (RUN-030): the pull loops fetch nothing more, and every
        delivery parked in a prefetch queue is NAKed back to the broker at once. The
        deliveries already handed out stay this receiver's to settle. Idempotent; a
        second call hands back nothing more.

        Returns:
            how many parked deliveries were handed back.
        """
        self.stopped = True
        if not self.connection.runner.running or not self.bindings.bound:
            return 0

        async def quiesce() -> int:
            receivers = self.bindings.receivers()
            await stop_all(receivers)
            handed = 0
            for receiver in receivers:
                handed += await receiver.hand_back(parked_only=True)
            return handed

        return int(self.connection.call(quiesce(), self.fetch_timeout + BROKER_CALL_SECONDS))


__all__ = ["Receiver"]
