"""The local queue of one binding's prefetched deliveries on JetStream: PrefetchQueue,
the half of SubscriptionReceiver that hands parked deliveries out to the caller's
thread, takes one back, and hands them all back to the broker (RUN-030).

take_ready and put_back are safe from any thread; hand_back runs on the adapter's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import nats.errors

from videoflow.backends.jetstream.receive_leases import HeldDelivery
from videoflow.backends.messaging import Delivery
from videoflow.errors import BrokerUnavailable


class PrefetchQueue:
    """The deliveries one binding parked, handed out: what the pull loop filled, taken
    by the caller's thread under the lock they share.

    A mixin: the attributes annotated here are the receiver's, set in its __init__.
    """

    _parked: deque[Delivery]
    _current: dict[int, HeldDelivery]
    _hand: threading.Lock
    _space_waiting: bool
    _space: asyncio.Event
    _loop: asyncio.AbstractEventLoop | None
    _broker_pending: int | None
    _handed_back: bool
    schedule: Callable[[Callable[[], Any]], None] | None
    _room_to_ask: Callable[[], int]

    @property
    def parked(self) -> int:
        """Deliveries fetched and parked, not yet handed out."""
        return len(self._parked)

    def backlog(self) -> int | None:
        """Deliveries waiting to be taken: parked here, plus what the broker still held
        for the consumer as of the latest delivery or short-ended request (no round
        trip); None before the broker has said anything. The broker's count covers
        what it can deliver now: messages it holds back (max_ack_pending reached) end
        a request short and count as none."""
        with self._hand:
            pending = self._broker_pending
            return None if pending is None else len(self._parked) + pending

    def resident_bytes(self) -> int:
        """Envelope bytes held live here, parked or handed out."""
        # Read from the caller's thread too: copy the values first (atomic under the
        # GIL) so the loop thread's inserts cannot break the iteration.
        return sum(h.delivery.size for h in list(self._current.values()))

    def take_ready(self, item_credit: int, byte_credit: int = 0) -> list[Delivery]:
        """Hand out up to item_credit parked deliveries without waiting (and about
        byte_credit bytes, 0 = unbounded: the first always goes). Safe from any
        thread: the caller's takes them straight off the queue the loop parks into,
        with no round trip through the loop; the pull loop is woken (one call onto
        the loop) only when it waits for room and this take made enough to ask for
        more (_room_to_ask)."""
        taken: list[Delivery] = []
        size = 0
        with self._hand:
            parked = self._parked
            while parked and len(taken) < item_credit:
                delivery = parked[0]
                if byte_credit and taken and size + delivery.size > byte_credit:
                    break
                parked.popleft()
                held = self._current.get(delivery.stream_seq)
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

    def put_back(self, delivery: Delivery) -> None:
        """Return a delivery just taken (and not handed to anyone) to the queue's head."""
        with self._hand:
            held = self._current.get(delivery.stream_seq)
            if held is not None and held.delivery.token == delivery.token:
                held.parked = True
                self._parked.appendleft(delivery)

    async def hand_back(self, parked_only: bool) -> int:
        """NAK deliveries back to the broker at once (RUN-030) so a survivor gets them
        now, not after ack_wait: the parked ones, or every live one. A fire-and-forget
        nak (Msg.nak) is enough — the worst case is the lease lapsing as it would have.

        Returns:
            how many were handed back.
        """
        self._handed_back = True
        with self._hand:  # chosen at once, so no take hands one out meanwhile
            chosen = [held for held in self._current.values()
                      if held.parked or not parked_only]
            for held in chosen:
                del self._current[held.delivery.stream_seq]
            self._parked.clear()  # whatever stayed parked was superseded
        handed = 0
        for held in chosen:
            with contextlib.suppress(nats.errors.Error):
                await held.msg.nak()  # MsgAlreadyAckdError: settled elsewhere; leave it
                handed += 1
        self._space.set()
        return handed


__all__ = ["PrefetchQueue"]
