"""broker.reads.GatheringParser against nats-py's own parser: the same protocol bytes,
split into reads anywhere (a large message's header block, its payload, the CRLF after
it, what follows it in the same read), hand on the same messages, pings and pongs, in
the same order, each payload bytes."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from nats.protocol.parser import Parser

from videoflow.broker.reads import GATHERED_PAYLOAD, GatheringParser

LARGE = GATHERED_PAYLOAD + 4_321


class Recorder:
    """Stands in for the client a parser calls back into: keeps what it is handed."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes,
                           headers: bytes | None) -> None:
        self.events.append(("msg", sid, bytes(subject), bytes(reply), type(data), data,
                            headers))

    async def _process_ping(self) -> None:
        self.events.append(("ping",))

    async def _process_pong(self) -> None:
        self.events.append(("pong",))


def hmsg(subject: str, sid: int, reply: str, header: bytes, payload: bytes) -> bytes:
    line = f"HMSG {subject} {sid} {reply} {len(header)} {len(header) + len(payload)}\r\n"
    return line.encode() + header + payload + b"\r\n"


def msg(subject: str, sid: int, payload: bytes) -> bytes:
    return f"MSG {subject} {sid} {len(payload)}\r\n".encode() + payload + b"\r\n"


def payload_of(size: int, seed: int) -> bytes:
    """Bytes that hold protocol-looking text (CRLFs, 'MSG ', 'PING') throughout."""
    body = random.Random(seed).randbytes(size)
    trap = b"\r\nMSG a 1 5\r\nPING\r\n"
    return trap + body[len(trap):-len(trap)] + trap


HEADER = b"NATS/1.0\r\nNats-Msg-Id: m-1\r\n\r\n"
PARTS = [
    msg("small", 1, b"hello"),
    hmsg("frames.cam0", 2, "_INBOX.x", HEADER, payload_of(LARGE, 1)),
    b"PING\r\n",
    msg("frames.raw", 3, payload_of(LARGE + 1, 2)),       # no header block
    hmsg("frames.cam1", 2, "_INBOX.y", HEADER, payload_of(LARGE, 3)),
    hmsg("frames.cam1", 2, "_INBOX.z", HEADER, payload_of(LARGE, 4)),  # back to back
    hmsg("small.h", 4, "_INBOX.w", HEADER, b"x"),
    b"PONG\r\n",
]
STREAM = b"".join(PARTS)
FIRST_LARGE = PARTS[1]


def ends_of_large_payloads() -> list[int]:
    """Where each large message's payload ends in STREAM (its CRLF starts there)."""
    ends, start = [], 0
    for part in PARTS:
        start += len(part)
        if len(part) > LARGE:
            ends.append(start - 2)
    return ends


def parsed(parser_class: type[Parser], reads: list[bytes]) -> list[tuple[Any, ...]]:
    recorder = Recorder()
    parser = parser_class(recorder)

    async def feed() -> None:
        for read in reads:
            await parser.parse(read)

    asyncio.run(feed())
    assert not parser.buf, "bytes left unparsed"
    return recorder.events


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c for c in cuts if 0 < c < len(data))})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False)]


EXPECTED = parsed(Parser, [STREAM])


def test_nats_py_reads_the_stream_as_written() -> None:
    kinds = [event[0] for event in EXPECTED]
    assert kinds == ["msg", "msg", "ping", "msg", "msg", "msg", "msg", "pong"]
    assert EXPECTED[1][5] == payload_of(LARGE, 1) and EXPECTED[1][6] == HEADER
    assert EXPECTED[3][5] == payload_of(LARGE + 1, 2) and EXPECTED[3][6] is None


@pytest.mark.parametrize("size", [1_000, 4_096, 65_536, 65_537, 1 << 20, len(STREAM)])
def test_reads_of_any_one_size_hand_on_what_nats_py_does(size: int) -> None:
    reads = [STREAM[i:i + size] for i in range(0, len(STREAM), size)]
    events = parsed(GatheringParser, reads)
    assert events == EXPECTED
    assert all(event[4] is bytes for event in events if event[0] == "msg")


@pytest.mark.parametrize("shift", range(-4, 5))
def test_a_read_ending_anywhere_around_a_large_payloads_end(shift: int) -> None:
    # The CRLF after the payload whole in a read, split over two, or the read ending
    # just before it or just after it, with the next message's bytes behind.
    cuts = [end + shift for end in ends_of_large_payloads()]
    cuts += [c + 65_536 for c in range(0, len(STREAM), 65_536)]
    assert parsed(GatheringParser, split(STREAM, cuts)) == EXPECTED


@pytest.mark.parametrize("seed", range(12))
def test_reads_split_at_random(seed: int) -> None:
    rng = random.Random(seed)
    cuts = [rng.randrange(len(STREAM)) for _ in range(rng.choice([3, 40, 400]))]
    # Some cuts inside the control lines and header blocks, where a read rarely ends.
    cuts += [STREAM.index(b"HMSG", rng.randrange(len(STREAM) // 2)) + rng.randrange(60)]
    assert parsed(GatheringParser, split(STREAM, cuts)) == EXPECTED


def test_a_large_message_is_gathered_not_grown_in_nats_pys_buffer() -> None:
    recorder = Recorder()
    parser = GatheringParser(recorder)

    async def feed() -> None:
        await parser.parse(FIRST_LARGE[:65_536])
        assert not parser.buf  # taken over: the reads wait in their own list
        await parser.parse(FIRST_LARGE[65_536:])

    asyncio.run(feed())
    assert recorder.events == [EXPECTED[1]]


def test_a_reset_mid_message_drops_what_was_gathered() -> None:
    # nats-py resets its parser on a reconnect: the new connection starts afresh.
    recorder = Recorder()
    parser = GatheringParser(recorder)

    async def feed() -> None:
        await parser.parse(FIRST_LARGE[:100_000])
        parser.reset()
        await parser.parse(PARTS[0])

    asyncio.run(feed())
    assert recorder.events == [EXPECTED[0]]
