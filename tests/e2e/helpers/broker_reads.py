"""What the end-to-end tests read back from the broker."""

from __future__ import annotations

import asyncio

import nats
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError


async def stream_names(url: str) -> list[str]:
    nc = await nats.connect(url)
    try:
        return [info.config.name for info in await nc.jetstream().streams_info()]
    finally:
        await nc.close()


async def ack_pending(url: str, stream: str, durable: str) -> int:
    """The durable's deliveries not yet acknowledged, as the broker tells it."""
    nc = await nats.connect(url)
    try:
        return int((await nc.jsm().consumer_info(stream, durable)).num_ack_pending or 0)
    finally:
        await nc.close()


async def wait_for_pullers(url: str, durable: str, count: int, timeout: float) -> int:
    """Wait until `count` distinct connections have asked the durable for messages (its
    pull requests, seen on the JetStream API subject, each replying to an inbox of its
    own connection); returns how many were seen.

    Raises:
        TimeoutError: fewer asked within timeout.
    """
    nc = await nats.connect(url)
    inboxes: set[str] = set()
    enough = asyncio.Event()

    async def seen(msg: Msg) -> None:
        inboxes.add(msg.reply.rsplit(".", 1)[0])
        if len(inboxes) >= count:
            enough.set()

    try:
        await nc.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.*.{durable}", cb=seen)
        await asyncio.wait_for(enough.wait(), timeout)
        return len(inboxes)
    finally:
        await nc.close()


async def durable_state(url: str, durable: str) -> dict[str, int] | None:
    """The broker's view of a durable, on whichever stream holds it: what it delivered,
    what of that is unacknowledged, and its ack floor (the stream sequence below which
    everything is acknowledged); None while no stream has it."""
    nc = await nats.connect(url)
    try:
        jsm = nc.jsm()
        for stream in await jsm.streams_info():
            try:
                infos = await jsm.consumers_info(stream.config.name)
            except NotFoundError:  # deleted since it was listed: the run ended
                continue
            for info in infos:
                if info.name == durable:
                    return {"delivered": int(info.delivered.stream_seq or 0),
                            "ack_pending": int(info.num_ack_pending or 0),
                            "ack_floor": int(info.ack_floor.stream_seq or 0)}
        return None
    finally:
        await nc.close()
