"""A binding's settlement on JetStream (videoflow.backends.jetstream.delivery_leases,
through a SubscriptionReceiver's leases) against a real nats-server: confirmed, fenced
settlement (MSG-011, PAY-004) and a batch of it pipelined, one round trip confirming a
run of acks. Never a mock broker."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
from jetstream_helpers import (
    FLOW,
    RUN,
    Wired,
    ack_floor,
    batch_channel,
    bound,
    consumer_state,
    publish,
    take,
)
from nats.aio.msg import Msg

from videoflow.backends.jetstream.configs import consumer_config_for
from videoflow.backends.jetstream.streams import ensure_consumer
from videoflow.backends.messaging import (
    Completed,
    Delivery,
    DeliveryToken,
    Retry,
    SettleConfirmed,
    SettleStale,
    SettleUnknown,
    Terminal,
)
from videoflow.broker import server as embedded

pytestmark = pytest.mark.timeout(60)

Freeze = Callable[[embedded.EmbeddedServer], contextlib.AbstractContextManager[None]]
"""The conftest's freeze fixture: SIGSTOP a server for the with block."""


def test_completed_is_confirmed_by_the_server_and_moves_the_ack_floor(wired: Wired) -> None:
    batch_channel(wired, "acked")
    publish(wired, "acked", 2)
    receiver = bound(wired, "acked")
    first, second = take(wired, receiver, credit=2)
    assert (first.stream_seq, first.num_delivered, first.data) == (1, 1, b"m0")
    assert first.token.generation == 0
    assert wired.run(receiver.leases.settle(first.token, Completed(), "s-1")) == SettleConfirmed()
    assert wired.run(receiver.leases.settle(second.token, Completed(), "s-2")) == SettleConfirmed()
    assert ack_floor(wired, "acked") == 2
    # The same settlement id again is the first answer, not a second ack.
    assert wired.run(receiver.leases.settle(first.token, Completed(), "s-1")) == SettleConfirmed()
    wired.run(receiver.stop())



def test_a_stale_token_is_settle_stale_and_sends_nothing(wired: Wired) -> None:
    batch_channel(wired, "stale")
    publish(wired, "stale", 1)
    receiver = bound(wired, "stale", generation=3)
    (delivery,) = take(wired, receiver)
    older_binding = DeliveryToken(delivery.token.subscription, delivery.stream_seq,
                                  delivery.num_delivered, generation=2)
    assert isinstance(wired.run(receiver.leases.settle(older_binding, Terminal("dlq:1"), "x")),
                      SettleStale)
    assert wired.run(receiver.leases.settle(delivery.token, Completed(), "a")) == SettleConfirmed()
    # Settled: a second, different settlement of the same token sends nothing.
    assert isinstance(wired.run(receiver.leases.settle(delivery.token, Retry(0.0), "b")),
                      SettleStale)
    assert wired.run(receiver.leases.renew(delivery.token)).state == "stale"
    wired.run(receiver.stop())



def test_redelivery_after_ack_wait_increments_num_delivered_and_fences_the_first_token(
    wired: Wired,
) -> None:
    batch_channel(wired, "lapse", ack_wait=1)
    publish(wired, "lapse", 1)
    receiver = bound(wired, "lapse")
    (first,) = take(wired, receiver)
    (again,) = take(wired, receiver, wait=10.0)  # the lease lapses after ack_wait=1s
    assert again.stream_seq == first.stream_seq
    assert again.num_delivered == first.num_delivered + 1
    assert isinstance(wired.run(receiver.leases.settle(first.token, Completed(), "old")),
                      SettleStale)
    assert wired.run(receiver.leases.settle(again.token, Completed(), "new")) == SettleConfirmed()
    assert ack_floor(wired, "lapse") == 1
    wired.run(receiver.stop())



def test_retry_with_delay_and_terminal_are_confirmed(wired: Wired) -> None:
    batch_channel(wired, "retry")
    publish(wired, "retry", 2)
    receiver = bound(wired, "retry")
    retried, terminated = take(wired, receiver, credit=2)
    started = time.monotonic()
    assert wired.run(receiver.leases.settle(retried.token, Retry(0.5), "r")) == SettleConfirmed()
    assert wired.run(receiver.leases.settle(terminated.token, Terminal("dlq:seq-2"), "t")) == (
        SettleConfirmed())
    (redelivered,) = take(wired, receiver, wait=5.0)
    assert time.monotonic() - started >= 0.4  # the NAK's delay was honoured
    assert (redelivered.stream_seq, redelivered.num_delivered) == (1, 2)
    assert wired.run(receiver.leases.settle(redelivered.token, Completed(), "c")) == (
        SettleConfirmed())
    assert ack_floor(wired, "retry") == 2  # the terminated message never comes back
    assert take(wired, receiver, wait=1.0) == []
    wired.run(receiver.stop())



def test_an_unconfirmed_ack_is_settle_unknown_and_may_be_retried(
    wired: Wired, nats_server: embedded.EmbeddedServer, freeze: Freeze
) -> None:
    batch_channel(wired, "unconfirmed")
    publish(wired, "unconfirmed", 1)
    receiver = bound(wired, "unconfirmed", ack_confirm=0.5)
    (delivery,) = take(wired, receiver)
    with freeze(nats_server):  # only this test's own server
        outcome = wired.run(receiver.leases.settle(delivery.token, Completed(), "u"))
    assert isinstance(outcome, SettleUnknown)  # PAY-004: never assumed
    assert receiver.leases.live(delivery.token)
    assert wired.run(receiver.leases.settle(delivery.token, Completed(), "u")) == SettleConfirmed()
    wired.run(receiver.stop())



def test_a_confirmed_batch_means_every_ack_in_it_was_applied(wired: Wired) -> None:
    # The soundness of confirming a run of plain +ACKs by the reply to the request
    # after them (jetstream.delivery_leases): the moment settle_batch returns, the server must
    # hold every one of them as acknowledged — checked with nothing else in between,
    # on batches as large as a prefetch gets, several times over.
    batch_channel(wired, "pipelined", max_ack_pending=200)
    receiver = bound(wired, "pipelined", prefetch=200)
    settled = 0
    for round_no in range(5):
        publish(wired, "pipelined", 200)
        got: list[Delivery] = []
        deadline = time.monotonic() + 10
        while len(got) < 200 and time.monotonic() < deadline:
            got += take(wired, receiver, credit=200 - len(got))
        assert len(got) == 200
        results = wired.run(receiver.leases.settle_batch(
            [(d.token, Completed(), f"r{round_no}-{d.stream_seq}") for d in got]))
        assert results == [SettleConfirmed()] * 200
        settled += 200
        assert consumer_state(wired, "pipelined") == (settled, 0, 0)
    wired.run(receiver.stop())



def test_plain_acks_lost_with_a_replaced_connection_are_sent_again_and_confirmed(
    wired: Wired, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A broker killed mid-batch: the plain +ACKs were written to the old connection
    # and lost with it, the request after them reached the restarted server and was
    # answered. That reply confirms nothing about them (30 inputs stayed pending, the
    # run waited on a redelivery that never came): they go again, confirmed.
    batch_channel(wired, "crossed")
    publish(wired, "crossed", 5)
    receiver = bound(wired, "crossed", prefetch=5)
    got = take(wired, receiver, credit=5, wait=10.0)
    assert len(got) == 5
    client = receiver.leases.client
    publish_on_the_wire, publish_now = client.publish, getattr(client, "publish_now", None)
    lost: list[str] = []

    def gone(subject: str, reply: str) -> bool:
        if not reply and len(lost) < 4:
            lost.append(subject)  # written to the old connection, gone with it
            return True
        if reply and len(lost) == 4 and client.stats["reconnects"] == 0:
            client.stats["reconnects"] += 1  # the request goes out on the new one
        return False

    async def across_a_reconnect(subject: str, payload: bytes = b"", reply: str = "",
                                 headers: dict[str, str] | None = None) -> None:
        if not gone(subject, reply):
            await publish_on_the_wire(subject, payload, reply=reply, headers=headers)

    def now_across_a_reconnect(subject: str, reply: str, payload: bytes,
                               headers: dict[str, str] | None, **options: Any) -> bool:
        assert publish_now is not None
        return False if gone(subject, reply) else publish_now(subject, reply, payload,
                                                              headers, **options)

    # Settlements go out through the fast client's publish_now, else nats-py's publish.
    monkeypatch.setattr(client, "publish", across_a_reconnect)
    if publish_now is not None:
        monkeypatch.setattr(client, "publish_now", now_across_a_reconnect)
    results = wired.run(receiver.leases.settle_batch(
        [(d.token, Completed(), f"c-{d.stream_seq}") for d in got]))
    assert len(lost) == 4
    assert results == [SettleConfirmed()] * 5
    assert consumer_state(wired, "crossed") == (5, 0, 0)
    wired.run(receiver.stop())


def test_a_reconnect_sends_the_latest_confirmed_acks_again(wired: Wired) -> None:
    # A nats-server SIGKILLed and restarted on its store had answered acks it had not
    # written yet: back, it held those inputs pending, or handed them out again to be
    # processed twice. After a reconnect the binding sends its latest confirmed +ACKs
    # again (idempotent).
    stream, _ = batch_channel(wired, "again")
    publish(wired, "again", 3)
    receiver = bound(wired, "again", prefetch=3)
    got = take(wired, receiver, credit=3, wait=10.0)
    assert len(got) == 3
    replies = [receiver.leases.held[d.stream_seq].msg.reply for d in got]
    results = wired.run(receiver.leases.settle_batch(
        [(d.token, Completed(), f"a-{d.stream_seq}") for d in got]))
    assert results == [SettleConfirmed()] * 3
    seen: list[tuple[str, bytes]] = []

    async def watch_acks() -> None:
        async def note(msg: Msg) -> None:
            seen.append((msg.subject, msg.data))
        await wired.client.subscribe(f"$JS.ACK.{stream}.>", cb=note)
        await wired.client.flush()

    async def reconnected() -> None:
        receiver.reconnected()  # as the connection's reconnected callback calls it
        deadline = time.monotonic() + 5
        while len(seen) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    wired.run(watch_acks())
    wired.run(reconnected())
    assert sorted(seen) == sorted((reply, b"+ACK") for reply in replies)
    assert consumer_state(wired, "again") == (3, 0, 0)
    wired.run(receiver.stop())


def test_a_message_handed_out_again_with_the_same_count_is_a_new_attempt(wired: Wired) -> None:
    # A nats-server SIGKILLed and restarted on its store had lost the latest deliveries
    # and acks it had not yet written, and handed those messages out again with the
    # same delivery count: equal tokens for two deliveries. The second's ack, under the
    # node's same settlement id, was answered from the first's and never sent, and the
    # keepalive renewed it for good (a run that never ended). Here the durable is made
    # again under the binding, the same loss on a running server: it hands out seq 1
    # and 2 once more, each with count 1.
    stream, _ = batch_channel(wired, "replayed")
    keeper = consumer_config_for(FLOW, RUN, "keeper", "replayed")  # keeps the interest
    wired.run(ensure_consumer(wired.js, stream, keeper))
    publish(wired, "replayed", 2)
    receiver = bound(wired, "replayed", prefetch=2)
    first = take(wired, receiver, credit=2)
    assert [(d.stream_seq, d.num_delivered) for d in first] == [(1, 1), (2, 1)]
    assert wired.run(receiver.leases.settle(first[0].token, Completed(), "ack:g1:0")) == (
        SettleConfirmed())
    durable = "child--from--replayed"
    config = wired.run(wired.js.consumer_info(stream, durable)).config
    wired.run(wired.js.delete_consumer(stream, durable))
    wired.run(ensure_consumer(wired.js, stream, config))
    again = take(wired, receiver, credit=2, wait=10.0)
    # Attempt 2 of each: one more than this binding handed out, not the broker's 1.
    assert [(d.stream_seq, d.num_delivered) for d in again] == [(1, 2), (2, 2)]
    assert [d.token for d in again] != [d.token for d in first]
    # The first round is stale: its renewal and supersede touch nothing of the second.
    assert wired.run(receiver.leases.renew(first[1].token)).state == "stale"
    assert not receiver.leases.supersede(first[1].token)
    assert all(receiver.leases.live(d.token) for d in again)
    # The node settles the replayed group under the same id as before: it goes out.
    results = wired.run(receiver.leases.settle_batch(
        [(again[0].token, Completed(), "ack:g1:0"), (again[1].token, Completed(), "ack:g2:0")]))
    assert results == [SettleConfirmed()] * 2
    assert consumer_state(wired, "replayed") == (2, 0, 0)
    wired.run(receiver.stop())


def test_a_batch_keeps_each_settlement_s_own_result_and_outcome(wired: Wired) -> None:
    batch_channel(wired, "mixed")
    publish(wired, "mixed", 5)
    receiver = bound(wired, "mixed", prefetch=5)
    got = take(wired, receiver, credit=5)
    assert len(got) == 5
    stale = got[1].token
    assert receiver.leases.supersede(stale)  # retired locally: must not be sent
    results = wired.run(receiver.leases.settle_batch([
        (got[0].token, Completed(), "a"),
        (stale, Completed(), "b"),
        (got[2].token, Retry(0.0), "c"),
        (got[3].token, Terminal("dlq:mixed-4"), "d"),
        (got[4].token, Completed(), "e"),
    ]))
    assert [type(r) for r in results] == [SettleConfirmed, SettleStale, SettleConfirmed,
                                          SettleConfirmed, SettleConfirmed]
    # The retried one comes back as attempt 2; the superseded one was never settled,
    # so it comes back once its lease lapses, not now; the terminated one never.
    (again,) = take(wired, receiver)
    assert (again.stream_seq, again.num_delivered) == (got[2].stream_seq, 2)
    assert wired.run(receiver.leases.settle(again.token, Completed(), "f")) == SettleConfirmed()
    # A repeated settlement id of a settled token gives its first result, sending nothing.
    assert wired.run(receiver.leases.settle_batch([(got[0].token, Completed(), "a")])) == [
        SettleConfirmed()]
    floor, ack_pending, pending = consumer_state(wired, "mixed")
    assert (floor, ack_pending, pending) == (1, 1, 0)  # seq 2 still leased to nobody
    wired.run(receiver.stop())



def test_a_batch_to_a_vanished_durable_is_unknown_even_for_its_plain_acks(wired: Wired) -> None:
    # Negative control for the run rule: the +ACKs before the request are silently
    # lost when the durable is gone (S14), and only the request's no-responders reply
    # says so -- every settlement of the run must be unknown, none confirmed.
    stream, _ = batch_channel(wired, "vanished")
    publish(wired, "vanished", 4)
    receiver = bound(wired, "vanished", prefetch=4)
    got = take(wired, receiver, credit=4)
    assert len(got) == 4
    wired.run(receiver.stop())
    wired.run(wired.js.delete_consumer(stream, "child--from--vanished"))
    results = wired.run(receiver.leases.settle_batch(
        [(d.token, Completed(), f"v-{d.stream_seq}") for d in got]))
    assert all(isinstance(r, SettleUnknown) and "durable is gone" in r.reason
               for r in results), results
    assert all(receiver.leases.live(d.token) for d in got)  # PAY-004: nothing released



def test_a_batch_to_a_frozen_server_is_unknown_and_asks_again_after(
    wired: Wired, nats_server: embedded.EmbeddedServer, freeze: Freeze
) -> None:
    batch_channel(wired, "frozen-batch")
    publish(wired, "frozen-batch", 3)
    receiver = bound(wired, "frozen-batch", prefetch=3, ack_confirm=0.5)
    got = take(wired, receiver, credit=3)
    assert len(got) == 3
    items = [(d.token, Completed(), f"f-{d.stream_seq}") for d in got]
    with freeze(nats_server):  # only this test's own server
        frozen = wired.run(receiver.leases.settle_batch(items))
    assert all(isinstance(r, SettleUnknown) for r in frozen), frozen
    assert wired.run(receiver.leases.settle_batch(items)) == [SettleConfirmed()] * 3
    assert consumer_state(wired, "frozen-batch") == (3, 0, 0)
    wired.run(receiver.stop())

