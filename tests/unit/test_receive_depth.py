"""How deep a JetStream binding prefetches (SubscriptionReceiver.depth): the prefetch
for small messages, fewer once the sizes seen would pass PARK_BYTES, so the bindings
of a join of camera frames never ask the server for more than its connection buffer
holds. No broker: deliveries are parked as the inbox callback parks them."""

from __future__ import annotations

import asyncio

from nats.aio.msg import Msg

from videoflow.backends.messaging import ChannelId, SubscriptionId
from videoflow.messaging.credit import RECEIVE_PREFETCH
from videoflow.messaging.jetstream_receive import PARK_BYTES, SubscriptionReceiver


def receiver() -> SubscriptionReceiver:
    sub = SubscriptionId("fusion", ChannelId("f", "r", "cam0"))
    return SubscriptionReceiver(sub, client=None, stream="s", durable="d",  # type: ignore[arg-type]
                                generation=1, prefetch=RECEIVE_PREFETCH,
                                replies=object())  # type: ignore[arg-type]


def park(r: SubscriptionReceiver, seq: int, size: int) -> None:
    reply = f"$JS.ACK.s.d.1.{seq}.{seq}.1700000000000000000.0"
    r._park(Msg(_client=None, subject="vf.f.r.cam0", reply=reply,  # type: ignore[arg-type]
                data=b"x" * size))


def test_small_messages_prefetch_the_whole_depth() -> None:
    async def run() -> None:
        r = receiver()
        assert r.depth() < RECEIVE_PREFETCH  # nothing seen yet: a first, shallow ask
        for seq in range(1, 11):
            park(r, seq, 200)
        assert r.depth() == RECEIVE_PREFETCH
    asyncio.run(run())


def test_frames_shrink_the_depth_to_the_park_budget() -> None:
    async def run() -> None:
        r = receiver()
        frame = 640 * 480  # a VGA grey frame
        for seq in range(1, 41):
            park(r, seq, frame)
        assert r.depth() * frame <= PARK_BYTES < (r.depth() + 2) * frame
        huge = 25_000_000  # one message over the budget: still one at a time
        for seq in range(41, 200):
            park(r, seq, huge)
        assert r.depth() == 1
    asyncio.run(run())
