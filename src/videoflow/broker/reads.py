"""How a videoflow connection reads: bytes parsed as they arrive, large messages
gathered, and their rest read in a few reads.

- reads: the bytes a read of the socket brings are parsed inside the transport's read
  callback (InlineReads), where nats-py's read-loop task would be woken to parse them
  on the loop's next pass;
- a large message received (a frame, an object's chunk) is gathered (GatheringParser):
  its reads kept as they come and joined once, where nats-py's parser copies it out of
  one growing buffer twice;
- and on Linux its rest is read in a few large reads, the socket waking the loop only
  once it holds it (SO_RCVLOWAT, InlineReads), where a wake-up and a pass of the loop
  came with each 64 KiB the server wrote.

broker.client's FastHeadersClient reads through these where nats-py keeps the parser
and stream state they take over (parser_as_written, READER_STATE).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
import sys
from collections.abc import Callable, Coroutine
from typing import Any, Final, Protocol

from nats.protocol import parser as nats_parser

from videoflow.broker.eager import start_eagerly

logger = logging.getLogger(__name__)

GATHERED_PAYLOAD: Final = 256 * 1024
"""Message bytes (headers and payload) from which a received message is gathered by
GatheringParser: its reads are kept as they come and joined once, into the payload's
own bytes. nats-py's parser appends every read to one growing buffer (a copy, and the
buffer's own regrowths), then slices the payload out of it and copies the slice into
bytes (two more): for a 6.2 MB frame, four passes over its bytes per hop where one
does."""

GATHERED_READ: Final = 1 << 20
"""The most bytes of a message being gathered that one read waits for (SO_RCVLOWAT,
InlineReads): the server writes a large message in pieces of 64 KiB, and a reader
woken for each one read a 6.2 MB frame in about a hundred reads, each a pass of the
loop; at 1 MiB it takes seven. Measured here, a subscriber's CPU per 6.2 MB frame went
from 2.3-3.4 ms to 2.0-2.3 at 30 frames a second, and from 2.4-3.0 to 2.3-2.6 flat
out. Larger marks saved no more, and the last read, which the message waits for once
its last byte is in, grows with them."""


class GatheringParser(nats_parser.Parser):
    """nats-py's protocol parser, except that a message of GATHERED_PAYLOAD bytes or
    more is gathered: once its header block has arrived, the reads that bring the rest
    of it are kept (bytes, as the socket gave them) until it is whole, and joined into
    its payload in one copy. Handed on as nats-py hands a message on (_process_msg,
    payload bytes, header block bytes or None); what follows it in the last read is
    parsed as nats-py parses it.

    Arguments:
        nc: the client (nats-py's parser calls back into it).
    """

    def reset(self) -> None:
        super().reset()
        self._parts: list[bytes | memoryview] | None = None  # a message being gathered
        self._have = 0  # bytes gathered: payload and the CRLF after it
        self._payload = 0  # the payload's size
        self._header: bytes | None = None

    async def parse(self, data: bytes = b"") -> None:
        parts = self._parts
        if parts is not None:
            parts.append(data)
            self._have += len(data)
            if self._have < self._payload + nats_parser.CRLF_SIZE:
                return
            payload, data = self._whole(parts)
            header, args = self._header, self.msg_arg
            self._parts, self._header, self._have = None, None, 0
            self.state, self.needed = nats_parser.AWAITING_CONTROL_LINE, 0
            await self.nc._process_msg(args["sid"], args["subject"], args["reply"],
                                       payload, header)
        await super().parse(data)
        buf = self.buf
        if (self.state == nats_parser.AWAITING_MSG_PAYLOAD
                and self.needed >= GATHERED_PAYLOAD
                and self.header_needed <= len(buf) < self.needed + nats_parser.CRLF_SIZE):
            # Taken over from nats-py: its payload bytes so far start the parts.
            block = self.header_needed
            self._header = bytes(buf[:block]) if block else None
            self._payload = self.needed - block
            self._parts, self._have = [bytes(buf[block:])], len(buf) - block
            self.buf = bytearray()
            self.header_needed = 0

    def left(self) -> int:
        """Bytes of the message being gathered still to come (its payload's rest and
        the CRLF after it); 0 when none is."""
        if self._parts is None:
            return 0
        return self._payload + nats_parser.CRLF_SIZE - self._have

    def _whole(self, parts: list[bytes | memoryview]) -> tuple[bytes, bytes]:
        """The gathered message's payload, joined, and what its last read holds after
        it (for the parser to go on with)."""
        last = parts[-1]
        beyond = self._have - self._payload - nats_parser.CRLF_SIZE
        rest = bytes(memoryview(last)[len(last) - beyond:]) if beyond else b""
        drop = beyond + nats_parser.CRLF_SIZE
        while drop:  # the CRLF after the payload can straddle two reads
            last = parts[-1]
            if len(last) <= drop:
                parts.pop()
                drop -= len(last)
            else:
                parts[-1] = memoryview(last)[:len(last) - drop]
                drop = 0
        return b"".join(parts), rest


_PARSER_STATE: Final = ("buf", "state", "needed", "header_needed", "msg_arg")
"""What GatheringParser reads and sets of nats-py's parser (nats-py 2.9 to 2.16)."""


def parser_as_written() -> bool:
    """Whether nats-py's parser keeps the state GatheringParser takes over."""
    parser = nats_parser.Parser()
    return (inspect.iscoroutinefunction(nats_parser.Parser.parse)
            and all(hasattr(parser, name) for name in _PARSER_STATE)
            and (nats_parser.AWAITING_CONTROL_LINE, nats_parser.AWAITING_MSG_PAYLOAD,
                 nats_parser.CRLF_SIZE) == (1, 2, 2))


READER_STATE: Final = ("_waiter", "_buffer", "_eof", "_exception")
"""What InlineReads reads of an asyncio.StreamReader (Python 3.10 to 3.13)."""


class Reading(Protocol):
    """What InlineReads reads and sets of its client (FastHeadersClient): the parser,
    whether a read is being parsed inline, and what to call once it is."""

    _ps: nats_parser.Parser
    parsing_inline: bool
    after_reads: Callable[[], None] | None


class InlineReads:
    """Bytes read from the socket parsed as they arrive, inside the transport's read
    callback, instead of by nats-py's read-loop task, woken through the stream's
    buffer on the loop's next pass. Only when that task waits on an empty buffer:
    bytes already waiting, or an end of stream or error, go its way, in order.

    A parse that has to wait (nats-py's handlers can) goes on as a task (broker.eager),
    and bytes read meanwhile are kept for it. What a parse raises is set on the
    stream, so the read loop meets it and does what nats-py does (a protocol error:
    reconnect).

    Arguments:
        client: the client whose parser gets the bytes.
        reader: the stream its read loop reads from (one per connection).
    """

    __slots__ = ("_later", "_transport", "_waits_for", "client", "reader")

    def __init__(self, client: Reading, reader: asyncio.StreamReader) -> None:
        self.client, self.reader = client, reader
        self._later: list[bytes] | None = None  # read while a parse waits; None: none waits
        # Only a gathering parser says how much of a message is still to come.
        self._transport = (_read_ahead_transport(reader)
                           if isinstance(client._ps, GatheringParser) else None)
        self._waits_for = 0  # the socket's SO_RCVLOWAT when above 1 (_read_ahead)
        reader.feed_data = self.feed_data  # type: ignore[method-assign,assignment]  # this stream's

    def feed_data(self, data: bytes) -> None:
        """What the stream's protocol calls with each read."""
        if self._waits_for:
            # Whoever parses these bytes, the next wake-up comes for any that follow
            # until the parser has them and says again what it waits for.
            self._read_ahead(0)
        if self._later is not None:
            self._later.append(bytes(data))
            return
        reader = self.reader
        if (reader._waiter is None or reader._buffer or reader._eof  # type: ignore[attr-defined]
                or reader._exception is not None):  # type: ignore[attr-defined]
            asyncio.StreamReader.feed_data(reader, data)
            return
        self._later = []  # until the parse is done: bytes read meanwhile wait for it
        self.client.parsing_inline = True
        start_eagerly(self._carry_on(self.client._ps.parse(
            data if type(data) is bytes else bytes(data))), _CARRIED)

    async def _carry_on(self, parse: Coroutine[Any, Any, None]) -> None:
        try:
            await parse
            while self._later:
                later, self._later = b"".join(self._later), []
                await self.client._ps.parse(later)
        except Exception as error:
            self.reader.set_exception(error)
        finally:
            self._later = None
            self.client.parsing_inline = False
            if (self._transport is not None
                    and not self.reader._buffer):  # type: ignore[attr-defined]
                # Every byte read so far parsed: what the message being gathered
                # still lacks is on its way, and the socket may wait for it whole.
                self._read_ahead(self.client._ps.left())  # type: ignore[attr-defined]
            # Even when cancelled: a ring left for the read's end is rung, or the
            # receiver would wait for it for good.
            after = self.client.after_reads
            if after is not None:
                after()

    def _read_ahead(self, left: int) -> None:
        """Have the socket wake the loop only once `left` more bytes (at most
        GATHERED_READ) have arrived, and the read then take them all, or, for 0 (or
        less than a gathered message's worth), as soon as any arrive, as it does by
        default. Set only while every byte read has been parsed and a message is
        being gathered, so the mark is never more than what the server is sending
        anyway: the rest of that message. A socket that refuses it reads as before."""
        transport = self._transport
        if transport is None:
            return
        # Linux grows the receive buffer to hold the mark where it is smaller (its
        # window clamped to the mark until autotuning grows it further).
        want = min(left, GATHERED_READ) if left >= GATHERED_PAYLOAD else 0
        if want == self._waits_for:
            return
        try:
            transport.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_RCVLOWAT, max(1, want))
        except (OSError, AttributeError) as error:
            logger.debug("reads of large messages as they come: %r", error)
            self._transport, self._waits_for = None, 0
            return
        default = type(transport).max_size  # type: ignore[attr-defined]
        transport.max_size = max(want, default)  # type: ignore[attr-defined]
        self._waits_for = want


def _read_ahead_transport(reader: asyncio.StreamReader) -> asyncio.Transport | None:
    """The stream's transport if a read of it can wait for a large message's rest:
    plain TCP on Linux (whose poll honours SO_RCVLOWAT for TCP) read by asyncio's
    selector transport, whose reads take up to its max_size. None elsewhere (TLS,
    another loop, another system): reads come as the socket has them."""
    transport = getattr(reader, "_transport", None)
    if (sys.platform != "linux" or transport is None
            or not isinstance(getattr(type(transport), "max_size", None), int)
            or transport.get_extra_info("sslcontext") is not None):
        return None
    sock = transport.get_extra_info("socket")
    if sock is None or sock.type != socket.SOCK_STREAM or sock.family not in (
            socket.AF_INET, socket.AF_INET6):
        return None
    return transport


_CARRIED: set[asyncio.Task[None]] = set()
"""Parses that had to wait, going on as tasks."""


__all__ = ["GATHERED_PAYLOAD", "GATHERED_READ", "READER_STATE", "GatheringParser",
           "InlineReads", "Reading", "parser_as_written"]
