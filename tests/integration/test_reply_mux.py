"""The reply inbox (jetstream.reply_inbox.ReplyMux) against a real nats-server: replies
are handed over inside nats-py's read loop, to a callback or a future, and a
handler that fails never takes the connection down with it."""

from __future__ import annotations

import asyncio
import logging

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from videoflow.backends.jetstream.reply_inbox import ReplyMux
from videoflow.broker.loop import registered


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
async def test_replies_reach_callbacks_and_futures(nats_client: Client) -> None:
    mux = await echoing_mux(nats_client)
    got: list[bytes] = []
    done = asyncio.get_running_loop().create_future()

    def on_reply(msg: Msg) -> None:
        got.append(msg.data)
        if len(got) == 50:
            done.set_result(None)

    for i in range(50):
        await nats_client.publish("echo", b"%d" % i, reply=mux.expect_call(on_reply))
    subject, future = mux.expect()
    await nats_client.publish("echo", b"f", reply=subject)
    await asyncio.wait_for(done, 5)
    assert got == [b"re:%d" % i for i in range(50)]  # one connection: in order
    assert (await asyncio.wait_for(future, 5)).data == b"re:f"
    assert mux.waiting == 0


@pytest.mark.asyncio
async def test_a_failing_handler_is_logged_and_the_connection_lives(
        nats_client: Client, caplog: pytest.LogCaptureFixture) -> None:
    mux = await echoing_mux(nats_client)

    def broken(_msg: Msg) -> None:
        raise RuntimeError("handler bug")

    with caplog.at_level(logging.ERROR, logger="videoflow.backends.jetstream.reply_inbox"):
        await nats_client.publish("echo", b"x", reply=mux.expect_call(broken))
        subject, future = mux.expect()
        await nats_client.publish("echo", b"y", reply=subject)
        assert (await asyncio.wait_for(future, 5)).data == b"re:y"
    assert nats_client.is_connected
    assert any("handler failed" in record.getMessage() for record in caplog.records)


@pytest.mark.asyncio
async def test_an_abandoned_reply_is_dropped(nats_client: Client) -> None:
    mux = await echoing_mux(nats_client)
    called: list[Msg] = []
    subject = mux.expect_call(called.append)
    mux.abandon(subject)
    assert mux.waiting == 0
    await nats_client.publish("echo", b"z", reply=subject)
    probe, future = mux.expect()
    await nats_client.publish("echo", b"after", reply=probe)
    await asyncio.wait_for(future, 5)  # replies are in order: z came and went first
    assert called == []
