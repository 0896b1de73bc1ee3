"""broker.client's reads and writes against a real nats-server: bytes read are parsed
inside the transport's read callback (no pass of the loop for nats-py's read-loop
task), in order even when a parse has to wait; what a parse raises reaches the read
loop, which does what nats-py does; and writes held over a batch go out in one write
on the batch's own pass."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import nats
import nats.aio.client
import nats.errors
import numpy as np
import pytest

from videoflow.broker import client as fast
from videoflow.broker import server as embedded
from videoflow.broker.loop import registered
from videoflow.broker.reads import GATHERED_READ, InlineReads
from videoflow.broker.server import EmbeddedServer

pytestmark = pytest.mark.timeout(30)


class Observed(fast.FastHeadersClient):
    """The fast client, recording the task each message is parsed in (None: inside a
    callback of the loop, not a task) and the subjects in the order parsed."""

    def __init__(self) -> None:
        super().__init__()
        self.parsed_in: list[asyncio.Task[Any] | None] = []
        self.subjects: list[str] = []

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes,
                           headers: bytes) -> None:
        self.parsed_in.append(asyncio.current_task())
        self.subjects.append(subject.decode())
        await self.handle(subject.decode())
        await super()._process_msg(sid, subject, reply, data, headers)

    async def handle(self, subject: str) -> None:
        """What a handler does first (subclasses wait or raise)."""


class PlainObserved(fast.TlsClient):
    """nats-py's own reads (no inline parse), recording the task each message is parsed in."""

    def __init__(self) -> None:
        super().__init__()
        self.parsed_in: list[asyncio.Task[Any] | None] = []

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes,
                           headers: bytes) -> None:
        self.parsed_in.append(asyncio.current_task())
        await super()._process_msg(sid, subject, reply, data, headers)


async def one_by_one(reader: Any, sub: Any, count: int, url: str) -> list[bytes]:
    """Publish count messages from another connection, each once the last arrived."""
    publisher = await nats.connect(url)
    got = []
    try:
        for i in range(count):
            await publisher.publish("in.each", str(i).encode())
            await publisher.flush()
            got.append((await sub.next_msg(timeout=5)).data)
    finally:
        await publisher.close()
    return got


@pytest.mark.asyncio
async def test_a_message_read_by_an_idle_connection_is_parsed_in_the_read_callback(
        nats_server: EmbeddedServer) -> None:
    ours, theirs = Observed(), PlainObserved()
    for client in (ours, theirs):
        await client.connect(nats_server.url)
    try:
        subs = [await client.subscribe("in.each") for client in (ours, theirs)]
        for client in (ours, theirs):
            await registered(client, 5)
        await subs[1].unsubscribe()  # each one's pass reaches that one alone
        got = await one_by_one(ours, subs[0], 50, nats_server.url)
        await subs[0].unsubscribe()
        theirs_sub = await theirs.subscribe("in.each")
        await registered(theirs, 5)
        theirs.parsed_in.clear()
        got_theirs = await one_by_one(theirs, theirs_sub, 50, nats_server.url)
    finally:
        for client in (ours, theirs):
            await client.close()
    assert got == got_theirs == [str(i).encode() for i in range(50)]
    # Each arrived at a connection waiting for bytes: parsed in the read callback,
    # where nats-py's own client parses in its read-loop task.
    assert ours.parsed_in == [None] * 50
    assert len(theirs.parsed_in) == 50 and None not in theirs.parsed_in


class Waits(Observed):
    """Its handler of the first message on 'slow' waits 50 ms."""

    waited = False

    async def handle(self, subject: str) -> None:
        if subject == "in.slow" and not self.waited:
            self.waited = True
            await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_bytes_read_while_a_parse_waits_are_parsed_after_it_in_order(
        nats_server: EmbeddedServer) -> None:
    reader = Waits()
    await reader.connect(nats_server.url)
    publisher = await nats.connect(nats_server.url)
    try:
        sub = await reader.subscribe("in.*")
        await registered(reader, 5)
        await publisher.publish("in.slow", b"first")
        await publisher.flush()
        await asyncio.sleep(0.01)  # the reader's parse of it now waits
        for i in range(100):
            await publisher.publish("in.fast", str(i).encode())
        await publisher.flush()
        got = [(await sub.next_msg(timeout=5)).data for _ in range(101)]
    finally:
        await publisher.close()
        await reader.close()
    assert reader.waited
    assert got == [b"first"] + [str(i).encode() for i in range(100)]
    assert reader.subjects == ["in.slow"] + ["in.fast"] * 100


class Breaks(Observed):
    """Its handler of the first message on 'bad' raises a protocol error."""

    broke = False

    async def handle(self, subject: str) -> None:
        if subject == "in.bad" and not self.broke:
            self.broke = True
            raise nats.errors.ProtocolError


@pytest.mark.asyncio
async def test_what_a_parse_raises_reaches_the_read_loop_which_reconnects(
        nats_server: EmbeddedServer) -> None:
    reconnected = asyncio.Event()

    async def on_reconnect() -> None:
        reconnected.set()

    reader = Breaks()
    await reader.connect(nats_server.url, reconnected_cb=on_reconnect,
                         reconnect_time_wait=0.1)  # type: ignore[arg-type]  # int only in its hint
    publisher = await nats.connect(nats_server.url)
    try:
        sub = await reader.subscribe("in.*")
        await registered(reader, 5)
        await publisher.publish("in.bad", b"x")
        await publisher.flush()
        # nats-py's answer to a protocol error in its read loop: a reconnect, after
        # which the subscription is made again and delivers.
        await asyncio.wait_for(reconnected.wait(), 10)
        await registered(reader, 5)
        await publisher.publish("in.after", b"y")
        await publisher.flush()
        msg = await sub.next_msg(timeout=5)
        while msg.subject != "in.after":  # "in.bad" may have been handed over first
            msg = await sub.next_msg(timeout=5)
    finally:
        await publisher.close()
        await reader.close()
    assert reader.broke and reader.stats["reconnects"] == 1
    assert msg.data == b"y"


@pytest.mark.asyncio
async def test_writes_held_over_a_batch_go_out_in_one_write_without_the_flusher(
        nats_server: EmbeddedServer) -> None:
    reader = await nats.connect(nats_server.url)
    writer = await fast.connect(nats_server.url)
    assert isinstance(writer, fast.FastHeadersClient)
    writes: list[int] = []
    transport = writer._transport
    assert transport is not None
    plain_writelines = transport.writelines

    def counted(lines: list[bytes]) -> None:
        writes.append(len(lines))
        plain_writelines(lines)

    transport.writelines = counted  # type: ignore[method-assign,assignment]  # counts this one's
    try:
        sub = await reader.subscribe("held")
        await registered(reader, 5)
        writer.hold_writes()
        await writer.publish("held", b"1")
        await writer.publish("held", b"2", headers=fast.encode_headers({"A": "b"}))
        await writer.publish("held", b"3", headers=fast.encode_headers({"C": "d"}))
        # Nothing written yet, and nats-py's flusher not asked to.
        assert (len(writer._pending), writes) == (3, [])
        assert writer._flush_queue is not None and writer._flush_queue.empty()
        writer.write_held()
        assert (writer._pending, writes) == ([], [3])
        got = [await sub.next_msg(timeout=5) for _ in range(3)]
    finally:
        await writer.close()
        await reader.close()
    assert [m.data for m in got] == [b"1", b"2", b"3"]
    assert [m.headers for m in got] == [None, {"A": "b"}, {"C": "d"}]


@pytest.mark.asyncio
async def test_a_large_payload_goes_to_the_socket_as_it_is_in_order_with_the_rest(
        nats_server: EmbeddedServer) -> None:
    # From LARGE_PAYLOAD bytes a payload is written as the object it is (a slice of a
    # frame: no join into the command, no copy before the socket's), after what was
    # pending, small writes held included, and before what follows.
    reader = await nats.connect(nats_server.url)
    writer = await fast.connect(nats_server.url)
    assert isinstance(writer, fast.FastHeadersClient)
    written: list[object] = []
    socket_side = writer._transport._io_writer.transport  # type: ignore[union-attr]
    plain_write = socket_side.write

    def recorded(data: Any) -> None:
        written.append(data)
        plain_write(data)

    socket_side.write = recorded
    frame = bytes(range(256)) * (3 * fast.LARGE_PAYLOAD // 256)
    large = memoryview(frame)[1:2 * fast.LARGE_PAYLOAD + 1]
    try:
        sub = await reader.subscribe("large.>")
        await registered(reader, 5)
        writer.hold_writes()
        await writer.publish("large.1", b"small before")
        await writer.publish("large.2", large, headers=fast.encode_headers({"A": "b"}))
        await writer.publish("large.3", large)
        writer.write_held()
        await writer.publish("large.4", b"small after")
        await writer.flush()
        got = [await sub.next_msg(timeout=5) for _ in range(4)]
    finally:
        await writer.close()
        await reader.close()
    assert [m.subject for m in got] == ["large.1", "large.2", "large.3", "large.4"]
    assert [m.data for m in got] == [b"small before", bytes(large), bytes(large),
                                     b"small after"]
    assert [m.headers for m in got] == [None, {"A": "b"}, None, None]
    assert sum(data is large for data in written) == 2


@pytest.mark.asyncio
async def test_a_large_payload_published_while_the_link_is_down_waits_for_the_reconnect(
        nats_server: EmbeddedServer) -> None:
    # Not written to a connection that is not up: nats-py's pending buffer keeps it, as
    # it is, and the reconnect sends it.
    reader = await nats.connect(nats_server.url)
    writer = await fast.connect(nats_server.url, max_reconnect_attempts=-1,
                                reconnect_time_wait=0.05)
    assert isinstance(writer, fast.FastHeadersClient)
    payload = b"\x01" * (fast.LARGE_PAYLOAD + 1)
    try:
        sub = await reader.subscribe("down")
        await registered(reader, 5)
        assert writer._transport is not None
        writer._transport._io_writer.transport.abort()  # type: ignore[union-attr]
        while writer.is_connected:
            await asyncio.sleep(0.001)
        await writer.publish("down", payload)
        assert writer._pending[-2:] == [payload, b"\r\n"]  # not joined into a command
        assert writer._pending[-2] is payload
        got = await sub.next_msg(timeout=10)
    finally:
        await writer.close()
        await reader.close()
    assert got.data == payload


def counted_reads(client: nats.aio.client.Client) -> list[int]:
    """The size of every read the client's connection hands its parser from now on."""
    reader = client._transport._io_reader  # type: ignore[union-attr]
    sizes: list[int] = []
    feed = reader.feed_data

    def counted(data: bytes) -> None:
        sizes.append(len(data))
        feed(data)

    reader.feed_data = counted
    return sizes


@contextlib.asynccontextmanager
async def fast_reader(url: str) -> AsyncIterator[tuple[nats.aio.client.Client,
                                                        nats.aio.client.Client]]:
    """(reader, writer): the fast client that reads, nats-py's that writes; both closed
    after."""
    reader = await fast.connect(url)
    writer = await nats.connect(url)
    try:
        yield reader, writer
    finally:
        await writer.close()
        await reader.close()


def read_mark(client: nats.aio.client.Client) -> int:
    """The client socket's SO_RCVLOWAT: how many bytes it waits for before a read."""
    transport = client._transport._io_reader._transport  # type: ignore[union-attr]
    return int(transport.get_extra_info("socket").getsockopt(socket.SOL_SOCKET,
                                                             socket.SO_RCVLOWAT))


@pytest.mark.skipif(sys.platform != "linux", reason="read-ahead is Linux's (SO_RCVLOWAT)")
@pytest.mark.asyncio
async def test_a_large_message_is_read_in_a_few_reads_and_what_follows_at_once(
        nats_server: EmbeddedServer) -> None:
    # The server writes a large message 64 KiB at a time; a reader woken for each piece
    # read a 6 MB one in about a hundred reads. Gathered, its rest is waited for
    # (GATHERED_READ at a time), and the socket then wakes for any byte again: a small
    # message after it, with nothing behind it, arrives at once.
    frame = np.random.default_rng(7).integers(0, 256, 6 << 20, dtype=np.uint8).tobytes()
    async with fast_reader(nats_server.url) as (reader, writer):
        sub = await reader.subscribe("ahead.>")
        await registered(reader, 5)
        sizes = counted_reads(reader)
        await writer.publish("ahead.large", frame, headers={"K": "v"})
        await writer.flush()
        large = await sub.next_msg(timeout=5)
        reads_of_large = len(sizes)
        assert read_mark(reader) == 1  # the message whole, back to reads as they come
        await writer.publish("ahead.small", b"after")
        await writer.flush()
        small = await sub.next_msg(timeout=1)
    assert (large.subject, large.headers, large.data == frame) == ("ahead.large",
                                                                    {"K": "v"}, True)
    assert reads_of_large <= 12, sizes
    assert (small.subject, small.data) == ("ahead.small", b"after")


@pytest.mark.skipif(sys.platform != "linux", reason="read-ahead is Linux's (SO_RCVLOWAT)")
@pytest.mark.asyncio
async def test_large_and_small_messages_back_to_back_arrive_whole_and_in_order(
        nats_server: EmbeddedServer) -> None:
    # Large messages one after another and small ones between them, all written before
    # the reader reads: each read takes at most the rest of the message being gathered,
    # and everything after it is parsed as it comes.
    rng = np.random.default_rng(8)
    sent = [(f"mix.{i}", rng.integers(0, 256, size, dtype=np.uint8).tobytes())
            for i, size in enumerate([3 << 20, 17, 5 << 20, 6 << 20, 300 << 10, 1, 1 << 20])]
    async with fast_reader(nats_server.url) as (reader, writer):
        sub = await reader.subscribe("mix.>")
        await registered(reader, 5)
        for subject, data in sent:
            await writer.publish(subject, data)
        await writer.flush()
        got = [await sub.next_msg(timeout=5) for _ in sent]
        mark = read_mark(reader)
    assert [(m.subject, m.data) for m in got] == sent
    assert mark == 1


@pytest.mark.skipif(sys.platform != "linux", reason="read-ahead is Linux's (SO_RCVLOWAT)")
@pytest.mark.asyncio
async def test_a_broker_that_dies_mid_message_is_seen_at_once_whatever_the_mark(
        tmp_path: Any) -> None:
    # The mark is set only while a large message is under way; should the broker die
    # then, its rest never comes. The socket's end wakes the read all the same, and
    # the client sees the connection lost at once, not when the mark is reached.
    lost = asyncio.Event()

    async def on_disconnect() -> None:
        lost.set()

    server = embedded.start(tmp_path / "store")
    reader = await fast.connect(server.url, disconnected_cb=on_disconnect,
                                max_reconnect_attempts=0)
    try:
        await reader.flush()
        reads = reader._transport._io_reader.feed_data.__self__  # type: ignore[union-attr]
        assert isinstance(reads, InlineReads)
        reads._read_ahead(GATHERED_READ)  # as when a message's rest is 1 MiB or more
        assert read_mark(reader) == GATHERED_READ
        assert server.process is not None
        server.process.kill()
        await asyncio.wait_for(lost.wait(), 2)
    finally:
        await reader.close()
        server.stop()
    assert not reader.is_connected
