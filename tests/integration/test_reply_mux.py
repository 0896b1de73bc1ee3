"""The reply inbox (jetstream.reply_inbox.ReplyMux) against a real nats-server: replies
are handed over inside nats-py's read loop, to a callback or a future, and a
handler that fails never takes the connection down with it -- on nats-py's own client
(through its _process_msg) and on videoflow's (which hands an inline subscription's
messages over itself)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from nats.aio.client import Client
from nats.aio.msg import Msg

from videoflow.backends.jetstream.reply_inbox import ReplyMux, subscribe_inline
from videoflow.broker import client as fast
from videoflow.broker.loop import registered
from videoflow.broker.server import EmbeddedServer


@pytest_asyncio.fixture(params=["nats-py", "videoflow"])
async def any_client(request: pytest.FixtureRequest,
                     nats_server: EmbeddedServer) -> AsyncIterator[Client]:
    """nats-py's own client, and the one every videoflow connection uses."""
    made = Client() if request.param == "nats-py" else fast.CLIENT_CLASS()
    await made.connect(nats_server.url, allow_reconnect=False)
    try:
        yield made
    finally:
        await made.close()


async def echoing_mux(client: Client) -> ReplyMux:
    """A started reply inbox on client, and a responder on "echo" answering re:<data>."""
    async def answer(msg: Msg) -> None:
        await client.publish(msg.reply, b"re:" + msg.data)

    await client.subscribe("echo", cb=answer)
    await registered(client, 5)
    mux = ReplyMux(client)
    await mux.start()
    return mux


@pytest.mark.asyncio
async def test_replies_reach_callbacks_and_futures(any_client: Client) -> None:
    mux = await echoing_mux(any_client)
    got: list[bytes] = []
    done = asyncio.get_running_loop().create_future()

    def on_reply(msg: Msg) -> None:
        got.append(msg.data)
        if len(got) == 50:
            done.set_result(None)

    for i in range(50):
        await any_client.publish("echo", b"%d" % i, reply=mux.expect_call(on_reply))
    subject, future = mux.expect()
    await any_client.publish("echo", b"f", reply=subject)
    await asyncio.wait_for(done, 5)
    assert got == [b"re:%d" % i for i in range(50)]  # one connection: in order
    assert (await asyncio.wait_for(future, 5)).data == b"re:f"
    assert mux.waiting == 0


@pytest.mark.asyncio
async def test_a_failing_handler_is_logged_and_the_connection_lives(
        any_client: Client, caplog: pytest.LogCaptureFixture) -> None:
    mux = await echoing_mux(any_client)

    def broken(_msg: Msg) -> None:
        raise RuntimeError("handler bug")

    with caplog.at_level(logging.ERROR, logger="videoflow.broker.client"):
        await any_client.publish("echo", b"x", reply=mux.expect_call(broken))
        subject, future = mux.expect()
        await any_client.publish("echo", b"y", reply=subject)
        assert (await asyncio.wait_for(future, 5)).data == b"re:y"
    assert any_client.is_connected
    assert any("handler failed" in record.getMessage() for record in caplog.records)


@pytest.mark.asyncio
async def test_an_abandoned_reply_is_dropped(any_client: Client) -> None:
    mux = await echoing_mux(any_client)
    called: list[Msg] = []
    subject = mux.expect_call(called.append)
    mux.abandon(subject)
    assert mux.waiting == 0
    await any_client.publish("echo", b"z", reply=subject)
    probe, future = mux.expect()
    await any_client.publish("echo", b"after", reply=probe)
    await asyncio.wait_for(future, 5)  # replies are in order: z came and went first
    assert called == []


@pytest.mark.asyncio
async def test_an_inline_subscription_gets_each_message_with_its_headers(
        any_client: Client) -> None:
    got: list[Msg] = []
    sub = await subscribe_inline(any_client, "inline.>", got.append)
    await registered(any_client, 5)
    for i in range(3):
        await any_client.publish("inline.x", b"%d" % i, headers={"A": str(i)})
    await any_client.flush()
    deadline = asyncio.get_running_loop().time() + 5
    while len(got) < 3 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    assert [(m.subject, m.data, m.headers) for m in got] == [
        ("inline.x", b"%d" % i, {"A": str(i)}) for i in range(3)]
    assert sub.delivered == 3
    # nats-py's _process_msg counts each message against the queue's slow-consumer
    # budget; videoflow's client hands it over to the handler without that.
    assert (sub._pending_size == 0) == isinstance(any_client, fast.FastHeadersClient)
