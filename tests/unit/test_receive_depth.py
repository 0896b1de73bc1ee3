"""How deep a JetStream binding prefetches (SubscriptionReceiver.depth): the prefetch
for small messages, fewer once the sizes seen would pass PARK_BYTES, so the bindings
of a join of camera frames never ask the server for more than its connection buffer
holds. No broker: deliveries are parked as the inbox callback parks them."""

from __future__ import annotations

import asyncio

from nats.aio.msg import Msg

from videoflow.backends.jetstream.subscription_receiver import PARK_BYTES, SubscriptionReceiver
from videoflow.backends.messaging import ChannelId, SubscriptionId
from videoflow.core.credit import RECEIVE_PREFETCH


def receiver() -> SubscriptionReceiver:
    sub = SubscriptionId("fusion", ChannelId("f", "r", "cam0"))
    return SubscriptionReceiver(sub, client=None, stream="s", durable="d",  # type: ignore[arg-type]
                                generation=1, prefetch=RECEIVE_PREFETCH,
                                replies=object())  # type: ignore[arg-type]


_PAYLOADS: dict[int, bytes] = {}


def park(r: SubscriptionReceiver, seq: int, size: int) -> None:
    reply = f"$JS.ACK.s.d.1.{seq}.{seq}.1700000000000000000.0"
    # One payload per size, shared: only its length matters here, and fresh 25 MB
    # copies for every park took most of the test's time and gigabytes of memory.
    data = _PAYLOADS.setdefault(size, b"x" * size)
    r._park(Msg(_client=None, subject="vf.f.r.cam0", reply=reply,  # type: ignore[arg-type]
                data=data))


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


def test_a_slow_node_asks_its_backend_for_a_shallow_prefetch() -> None:
    """The messenger sets the backend's receive depth to DEPTH_SECONDS of the node's
    time per group: a sink at 20 ms a group parks about 2, not RECEIVE_PREFETCH."""
    import time
    from types import SimpleNamespace

    from messenger_flows import Flow, run_producer

    from videoflow.messaging.nats_messenger import DEPTH_SECONDS, NATSMessenger

    flow = Flow({"cam": [], "sink": ["cam"]})
    cam = flow.messenger("cam")
    run_producer(cam, list(range(6)))
    backend = flow.backend()
    asked: list[int] = []
    backend.set_receive_depth = asked.append  # type: ignore[attr-defined]
    sink = NATSMessenger(SimpleNamespace(name="sink"), ["cam"], "nats://unused", "flow",
                         flow.flow_type, "run", backend=backend)
    try:
        for _ in range(6):
            sink.receive_message()
            time.sleep(0.02)
            sink.ack_inputs()
        assert asked and 1 <= asked[-1] <= DEPTH_SECONDS / 0.02
    finally:
        sink.close()
        cam.close()


def test_a_take_across_bindings_hands_out_only_what_was_parked_when_it_began() -> None:
    """take_round_robin against a loop run meanwhile by the keeper thread: each take
    wakes a pull loop, whose next delivery is parked while the rounds go on. Those are
    the next receive's: a caller taking them too leased one per round trip, far past
    the depth its bindings keep (a slow sink in the full suite held 7, not 2)."""
    from videoflow.backends.jetstream.subscription_receiver import take_round_robin

    class Refilled(SubscriptionReceiver):
        next_seq = 100

        def take_ready(self, item_credit: int, byte_credit: int = 0) -> list:  # type: ignore[type-arg]
            taken = super().take_ready(item_credit, byte_credit)
            Refilled.next_seq += 1  # what the pull loop asked for lands at once
            park(self, Refilled.next_seq, 200)
            return taken

    async def run() -> None:
        receivers = []
        for name in ("cam0", "cam1"):
            sub = SubscriptionId("fusion", ChannelId("f", "r", name))
            r = Refilled(sub, client=None, stream="s", durable="d",  # type: ignore[arg-type]
                         generation=1, prefetch=RECEIVE_PREFETCH,
                         replies=object())  # type: ignore[arg-type]
            for seq in (1, 2) if name == "cam0" else (3,):
                park(r, seq, 200)
            receivers.append((sub, r))

        taken = take_round_robin(receivers, 256, 0)

        assert [d.stream_seq for _, d in taken] == [1, 3, 2]
        assert [r.parked for _, r in receivers] == [2, 1]  # left for the next receive
    asyncio.run(run())
