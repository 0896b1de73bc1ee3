"""One binding's pull loop on JetStream (videoflow.backends.jetstream.subscription_receiver)
and its queue (videoflow.backends.jetstream.prefetch_queue) against a real nats-server:
handing parked deliveries back, waking the pull loop, a refused pull request. Never a
mock broker."""

from __future__ import annotations

import asyncio
import time

import pytest
from jetstream_helpers import (
    FLOW,
    RUN,
    Wired,
    batch_channel,
    bound,
    publish,
    take,
)

from videoflow.backends.jetstream.subscription_receiver import (
    PullRefused,
    bind_receiver,
)
from videoflow.backends.messaging import (
    ChannelId,
    Completed,
    SettleConfirmed,
    SubscriptionId,
)
from videoflow.core.naming import (
    stream_name_for,
)

pytestmark = pytest.mark.timeout(60)


def test_hand_back_returns_parked_deliveries_to_a_survivor_at_once(wired: Wired) -> None:
    batch_channel(wired, "quiesce")
    publish(wired, "quiesce", 3)
    leaving = bound(wired, "quiesce", prefetch=4)
    (in_hand,) = take(wired, leaving)

    async def parked_all() -> int:
        while leaving.parked < 2:
            await asyncio.sleep(0.05)
        await leaving.stop()
        return await leaving.hand_back(parked_only=True)

    assert wired.run(parked_all()) == 2  # RUN-030
    survivor = bound(wired, "quiesce", generation=1)
    got = take(wired, survivor, credit=2, wait=5.0)
    while len(got) < 2:
        got += take(wired, survivor, credit=2, wait=5.0)
    assert sorted(d.stream_seq for d in got) == [2, 3]
    # What was handed out stays the leaving receiver's to settle.
    assert wired.run(leaving.leases.settle(in_hand.token, Completed(), "kept")) == SettleConfirmed()
    wired.run(survivor.stop())



def test_a_take_wakes_the_pull_loop_only_once_it_made_room_to_ask_for(wired: Wired) -> None:
    """With a request open, the pull loop asks again once half its depth is free. A
    take that frees less leaves it asleep: a reader that keeps up takes every
    delivery as it arrives, and woken for each take, to find nothing to ask for, the
    loop cost it several turns a message. The take that frees enough wakes it, and
    the room is asked for at once."""
    batch_channel(wired, "room")
    publish(wired, "room", 4)  # the first request's (no size seen yet: 4)
    sub = SubscriptionId("child", ChannelId(FLOW, RUN, "room"))
    # A fetch far longer than the test: the open request does not expire meanwhile.
    receiver = wired.run(bind_receiver(wired.client, sub, stream_name_for(FLOW, RUN, "room"),
                                       "child--from--room", 0, prefetch=8,
                                       fetch_timeout=60.0, ack_confirm_seconds=2.0))

    def asked() -> int:
        return sum(pull.remaining for pull in list(receiver._pulls.values()))

    deadline = time.monotonic() + 5
    # The 4 parked, and a second request, for the 4 more the depth of 8 holds, open.
    while not (receiver.parked == 4 and asked() == 4 and receiver._space_waiting):
        assert time.monotonic() < deadline, (receiver.parked, asked())
        time.sleep(0.005)
    wakes: list[int] = []
    space = receiver._space
    real_set = space.set

    def counted() -> None:
        wakes.append(receiver.parked)
        real_set()

    space.set = counted  # type: ignore[method-assign]
    for taken in range(1, 4):  # an eighth, a quarter, three eighths of the depth free
        assert len(receiver.take_ready(1)) == 1
        time.sleep(0.2)  # the keeper runs the loop meanwhile: a wake would have run
        assert (wakes, asked()) == ([], 4), taken
    assert len(receiver.take_ready(1)) == 1  # half the depth free: ask for it
    deadline = time.monotonic() + 5
    while asked() < 8:
        assert time.monotonic() < deadline, (wakes, asked())
        time.sleep(0.005)
    assert wakes == [0]
    wired.run(receiver.stop())



def test_a_durable_deleted_under_a_running_pull_loop_is_refused_without_a_spin(
    wired: Wired,
) -> None:
    # S14: with the durable gone every pull request is refused at once (503 no
    # responders); the loop must keep the refusal for observation and ask again a
    # fetch later, not hammer the server.
    stream, _ = batch_channel(wired, "deleted")
    receiver = bound(wired, "deleted")  # fetch_timeout 0.5
    wired.run(wired.js.delete_consumer(stream, "child--from--deleted"))
    time.sleep(1.6)
    refusals = receiver.refusals
    assert 1 <= refusals <= 5, refusals  # about one per fetch_timeout, not thousands
    assert isinstance(receiver.last_error, PullRefused)
    assert receiver.receiving  # it keeps trying: the durable may be provisioned again
    wired.run(receiver.stop())

