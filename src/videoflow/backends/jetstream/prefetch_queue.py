"""The local queue of one binding's prefetched deliveries on JetStream: PrefetchQueue,
the part of a SubscriptionReceiver that holds what its pull loop parked and every
delivery still live, under the lock the caller's thread and the loop share.

The caller's thread takes parked deliveries under lock (SubscriptionReceiver.take_ready);
put_back is safe from any thread; withdraw runs on the adapter's loop.
"""

from __future__ import annotations

import threading
from collections import deque

from videoflow.backends.jetstream.delivery_leases import HeldDelivery
from videoflow.backends.messaging import Delivery


class PrefetchQueue:
    """The deliveries one binding parked, and those it holds live (parked or handed out,
    not settled): what the pull loop fills, taken by the caller's thread under the lock
    they share.

    Attributes:
        lock: covers parked and every held delivery's parked flag, on both threads
            (and, for its SubscriptionReceiver, whether its pull loop waits for room).
        parked: the deliveries fetched and not yet handed out, oldest first.
        held: every live delivery by stream sequence (its DeliveryLeases settle them).
        broker_pending: what the broker still held for the consumer at the latest
            delivery (its reply subject says), or 0 once a request ended short; None
            before either.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.parked: deque[Delivery] = deque()
        self.held: dict[int, HeldDelivery] = {}
        self.broker_pending: int | None = None

    def backlog(self) -> int | None:
        """Deliveries waiting to be taken: parked here, plus what the broker still held
        for the consumer as of the latest delivery or short-ended request (no round
        trip); None before the broker has said anything. The broker's count covers
        what it can deliver now: messages it holds back (max_ack_pending reached) end
        a request short and count as none."""
        with self.lock:
            pending = self.broker_pending
            return None if pending is None else len(self.parked) + pending

    def resident_bytes(self) -> int:
        """Envelope bytes held live here, parked or handed out."""
        # Read from the caller's thread too: copy the values first (atomic under the
        # GIL) so the loop thread's inserts cannot break the iteration.
        return sum(h.delivery.size for h in list(self.held.values()))

    def put_back(self, delivery: Delivery) -> None:
        """Return a delivery just taken (and not handed to anyone) to the queue's head."""
        with self.lock:
            held = self.held.get(delivery.stream_seq)
            if held is not None and held.delivery.token == delivery.token:
                held.parked = True
                self.parked.appendleft(delivery)

    def withdraw(self, parked_only: bool) -> list[HeldDelivery]:
        """Forget the parked deliveries, or every live one, and return them (to be
        handed back to the broker): chosen at once, so no take hands one out
        meanwhile."""
        with self.lock:
            chosen = [held for held in self.held.values() if held.parked or not parked_only]
            for held in chosen:
                del self.held[held.delivery.stream_seq]
            self.parked.clear()  # whatever stayed parked was superseded
        return chosen


__all__ = ["PrefetchQueue"]
