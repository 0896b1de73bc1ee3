"""The NATS client every videoflow connection uses: nats-py's, with NATS headers made
and read in a fraction of the time.

Every envelope a node publishes carries headers (traceparent, and Nats-Msg-Id where the
broker deduplicates), so their cost is paid once per message per hop, both ways.
nats-py builds a header block key by key (a regex, a translate and three encodes per
pair) and reads one through a general parser (status lines, email-style quirks,
undecodable bytes): measured here, 3-6 us to publish and 3-4 us to receive a message
with one header over one without, on a node whose whole hop costs a few tens.

Two fast paths, each taken only where its result is byte for byte nats-py's own, and
nats-py's way otherwise:

- publishing: encode_headers(pairs) returns HeaderBlock, a dict of the same pairs that
  also holds its encoded block; Client._send_publish writes that block as it is. Pairs
  that nats-py would change (a key that is not a token, a value with spaces at its
  ends, a control or non-ASCII character) get a plain dict, which nats-py encodes.
- receiving: a block of plain 'Token: printable ASCII' lines and no status is split
  directly (plain_headers); anything else (a status line such as a pull's 408, an
  undecodable byte, a malformed line) goes to nats-py's parser.

And for the bytes themselves (FastHeadersClient):

- a small publication (publish_now: a node's output, a settlement) goes straight into
  the pending buffer, with nats-py's checks, without the two coroutines its publish
  makes and awaits per message;
- a large message received (a frame, an object's chunk) is gathered, and read in a
  few large reads (broker.reads: GatheringParser, InlineReads).

Two more spare the loop a pass per message each way (FastHeadersClient):

- reads: the bytes a read of the socket brings are parsed inside the transport's read
  callback (broker.reads.InlineReads), where nats-py's read-loop task would be woken to
  parse them on the loop's next pass;
- writes: publications and settlements made while a drain of the loop's wake-up holds
  the writes (hold_writes) leave in one socket write at its end (write_held), where
  nats-py's flusher task would write them on the next pass.

And TlsClient holds a connection to the TLS it asked for: upgraded when the server
only offers it, refused before CONNECT when it does not (nats-py goes by the server's
INFO alone).

These override private methods of nats-py's Client (_send_publish, _process_headers,
_process_info, _read_loop, _process_msg) and its parser's parse, and read its pending
buffer and its stream's state.
They are used only when nats-py has them with the signatures they were written
against (FAST_HEADERS); with another nats-py, Client is nats-py's own and only speed
differs. tests/integration/test_nats_headers.py holds both paths to nats-py's results.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
from collections.abc import Callable
from typing import Any, Final

import nats.aio.client
import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.protocol.command import hpub_cmd, pub_cmd

from videoflow.broker.options import AskedTls
from videoflow.broker.reads import READER_STATE, GatheringParser, InlineReads, parser_as_written
from videoflow.errors import TLSRefused

logger = logging.getLogger(__name__)

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""A header name nats-py writes (its _HEADER_KEY_RE)."""
_TOKENS: set[str] = set()  # names seen to be tokens (publishing)
_SPACELESS: set[str] = set()  # names seen without a space inside (receiving)
_REMEMBERED: Final = 256  # at most, of each: names come from any publisher
_VERSION_LINE: Final = "NATS/1.0\r\n"
_BYTES_SPACE: Final = " \t\n\r\x0b\x0c"  # what bytes.strip() strips
_STR_SPACE = re.compile(r"[\s]")  # what str.isspace() is true of, in ASCII


class HeaderBlock(dict[str, str]):
    """Headers to publish, with their wire form: the pairs (a dict, as nats-py takes
    headers) and block, 'NATS/1.0' and the pairs as nats-py would encode them."""

    __slots__ = ("block",)

    def __init__(self, pairs: dict[str, str], block: bytes) -> None:
        dict.__init__(self, pairs)  # one per output: super() would cost a third more
        self.block = block


def written_as_is(value: str) -> bool:
    """Whether nats-py writes a header value unchanged: printable ASCII without
    spaces at its ends."""
    return value.isascii() and value.isprintable() and value == value.strip()


def encode_headers(pairs: dict[str, str]) -> dict[str, str]:
    """Headers to publish: a HeaderBlock when nats-py would write every pair unchanged
    (a token name; a printable ASCII value without spaces at its ends), else a plain
    dict of the pairs (nats-py then encodes them its way).

    Arguments:
        pairs: header names and values.
    """
    lines = _VERSION_LINE
    for name, value in pairs.items():
        if name not in _TOKENS:
            if _TOKEN.fullmatch(name) is None:
                return dict(pairs)
            if len(_TOKENS) < _REMEMBERED:
                _TOKENS.add(name)
        if not written_as_is(value):
            return dict(pairs)
        lines += f"{name}: {value}\r\n"
    return HeaderBlock(pairs, (lines + "\r\n").encode())


def plain_headers(headers: bytes) -> dict[str, str] | None:
    """A received header block read as nats-py reads it, when it is ASCII and has no
    status line ('NATS/1.0 503', a pull's '408'); None otherwise, or when it holds no
    pair, for nats-py's parser. nats-py's own rules, over str: a line without ':' is
    skipped, a name with a space inside is skipped, names and values are stripped as
    bytes are."""
    if not (headers.isascii() and headers.startswith(b"NATS/1.0\r\n")):
        return None
    parsed = {}
    for line in headers.decode().split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if sep:
            name = name.strip(_BYTES_SPACE)
            if name not in _SPACELESS:
                if _STR_SPACE.search(name) is not None:
                    continue
                if len(_SPACELESS) < _REMEMBERED:
                    _SPACELESS.add(name)
            parsed[name] = value.strip(_BYTES_SPACE)
    return parsed or None


LARGE_PAYLOAD: Final = 64 * 1024
"""Payload bytes from which a publication's payload is never joined into a command
(FastHeadersClient._write_large): nats-py joins it into the command, a copy twice
over, and its flusher joins the commands into one write, a third; for frames and an
object store's chunks those passes over the bytes cost more than the socket's own
copy."""

WRITE_WAIT_SECONDS: Final = 0.5
"""Step of a large publication's wait for the socket to take it: each step ends with
a look at whether the connection is still the live one."""


def _has(method: str, parameters: tuple[str, ...]) -> bool:
    found = getattr(NatsClient, method, None)
    return (inspect.iscoroutinefunction(found)
            and tuple(inspect.signature(found).parameters) == parameters)


_VALIDATE_SUBJECT: Final[Callable[[str], None] | None] = getattr(
    nats.aio.client, "_validate_subject", None)
"""nats-py's own check of a subject it publishes to (2.16 on; before, it checked none)."""

FAST_HEADERS: Final = (
    _has("_send_publish", ("self", "subject", "reply", "payload", "payload_size", "headers"))
    and _has("_process_headers", ("self", "headers"))
    and _has("_send_command", ("self", "cmd", "priority"))
    and _has("_flush_pending", ("self", "force_flush"))
    and _has("_read_loop", ("self",))
    and _has("_process_msg", ("self", "sid", "subject", "reply", "data", "headers"))
    and tuple(inspect.signature(NatsClient._build_message).parameters)
    == ("self", "sid", "subject", "reply", "data", "headers")
    and parser_as_written())
"""Whether this nats-py has the private methods the fast paths override, as written
against (nats-py 2.9 to 2.16)."""


class TlsClient(NatsClient):
    """nats-py's Client, held to the TLS a connection asked for (broker.options.AskedTls,
    its ``tls``): nats-py goes by the server's INFO alone, upgrading only when it says
    tls_required, and would otherwise write CONNECT, credentials and all, in clear.
    Asked for TLS, a server that offers it (tls_available: allow_non_tls) is upgraded
    to as well, and one that does not is refused before anything is sent, at every
    connect and reconnect (TLSRefused, as the Go client's 'secure connection
    required').

    Attributes:
        certificate_asked: the latest server's INFO asks for a client certificate
            (tls_verify) and none was given: over TLS 1.3 the server's alert that says
            so can arrive after the client wrote CONNECT, and the reset that follows
            loses it (failures.tls_refusal).
    """

    certificate_asked = False

    async def _process_info(self, info: dict[str, Any],
                            initial_connection: bool = False) -> None:
        tls = self.options.get("tls")
        if initial_connection:
            self.certificate_asked = bool(info.get("tls_verify")) and not (
                isinstance(tls, AskedTls) and tls.has_certificate)
        if (initial_connection and isinstance(tls, AskedTls) and not info.get("tls_required")
                and not self.options.get("tls_handshake_first")):
            if not info.get("tls_available"):
                uri = self._current_server.uri if self._current_server else None
                where = "" if uri is None else f" at {uri.scheme}://{uri.hostname}:{uri.port}"
                raise TLSRefused(f"secure connection required (by {tls.asked_by}): the "
                                 f"broker{where} does not offer TLS; nothing was sent to it")
            # The same dict _process_connect_init reads as it decides to upgrade.
            info["tls_required"] = True
        await super()._process_info(info, initial_connection)


class FastHeadersClient(TlsClient):
    """nats-py's Client with the header fast paths, inline reads, inline
    subscriptions (InlineQueue) and writes held for one socket write at the end of a
    batch (hold_writes): the module docstring."""

    _holding = 0  # hold_writes calls not yet matched by write_held
    after_reads: Callable[[], None] | None = None
    """Called on the loop once the bytes of a read have been parsed inline and their
    messages handled: a receiver wakes its waiter once per read, on that pass."""
    parsing_inline = False
    """A read's bytes are being parsed inline: after_reads follows once they are."""

    def __init__(self) -> None:
        super().__init__()
        self._ps = GatheringParser(self)
        self._subjects_checked: set[str] = set()  # publish_now's

    async def _send_publish(self, subject: str, reply: str, payload: bytes,
                            payload_size: int, headers: dict[str, Any] | None) -> None:
        if headers is None:
            block = None
        elif type(headers) is HeaderBlock:
            block = headers.block
        else:
            await super()._send_publish(subject, reply, payload, payload_size, headers)
            return
        if subject == "":
            raise nats.errors.BadSubjectError
        self.stats["out_msgs"] += 1
        self.stats["out_bytes"] += payload_size
        if payload_size >= LARGE_PAYLOAD:
            await self._write_large(subject, reply, block, payload)
        else:
            await self._send_command(pub_cmd(subject, reply, payload) if block is None
                                     else hpub_cmd(subject, reply, block, payload))
        if not self._holding and self._flush_queue is not None and self._flush_queue.empty():
            await self._flush_pending()

    def publish_now(self, subject: str, reply: str, payload: bytes,
                    headers: dict[str, str] | None, *, repeated: bool = True) -> bool:
        """Publish a small message as Client.publish does, with its checks and its
        errors, without its coroutines: its command joins the pending buffer, for the
        held write or nats-py's flusher. A publisher calls it once per message, and the
        two coroutines nats-py makes and awaits for each were a tenth of a producer's
        time. The subject is checked as nats-py checks it, once per client for a
        repeated one (a node publishes to a few, over and over); reply must be one of
        the client's own inboxes (new_inbox), which nats-py's check always passes.

        Arguments:
            subject / reply / payload: as Client.publish's; payload under LARGE_PAYLOAD.
            headers: None or a HeaderBlock (encode_headers).
            repeated: the subject is published to again and again, and its check is
                remembered; False for one used once (an acknowledgement's).

        Returns:
            whether the pending buffer is over its bound: the caller then awaits
            flush_over before publishing more, as nats-py's publish would have.

        Raises:
            as Client.publish: BadSubjectError, ConnectionClosedError,
            ConnectionDrainingError, OutboundBufferLimitError, MaxPayloadError.
            ValueError: a payload of LARGE_PAYLOAD or more, or headers that are not a
                HeaderBlock.
        """
        if subject not in self._subjects_checked:
            if _VALIDATE_SUBJECT is not None and not getattr(
                    self, "_skip_subject_validation", False):
                _VALIDATE_SUBJECT(subject)
            if repeated and len(self._subjects_checked) < _REMEMBERED:
                self._subjects_checked.add(subject)
        if self.is_closed:
            raise nats.errors.ConnectionClosedError
        if self.is_draining_pubs:
            raise nats.errors.ConnectionDrainingError
        size = len(payload)
        if size >= LARGE_PAYLOAD:
            raise ValueError(f"publish_now takes payloads under {LARGE_PAYLOAD} bytes")
        if headers is not None and type(headers) is not HeaderBlock:
            raise ValueError("publish_now takes a HeaderBlock or no headers")
        if not self.is_connected and (
                self._max_pending_size <= 0
                or size + self._pending_data_size > self._max_pending_size):
            raise nats.errors.OutboundBufferLimitError
        if size > self._max_payload:
            raise nats.errors.MaxPayloadError
        stats = self.stats
        stats["out_msgs"] += 1
        stats["out_bytes"] += size
        if headers is None:
            command = b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply.encode(), size,
                                                     payload)
        else:
            block = headers.block
            command = b"HPUB %s %s %d %d\r\n%s%s\r\n" % (
                subject.encode(), reply.encode(), len(block), len(block) + size, block,
                payload)
        self._pending.append(command)
        self._pending_data_size += len(command)
        if 0 < self._max_pending_size < self._pending_data_size:
            return True
        if (not self._holding and self.is_connected and self._flush_queue is not None
                and self._flush_queue.empty()):
            # nats-py's _flush_pending: the flusher is kicked; not while disconnected
            # (the reconnect writes what is pending).
            self._flush_queue.put_nowait(asyncio.get_running_loop().create_future())
        return False

    async def flush_over(self) -> None:
        """What nats-py's publish does with a pending buffer over its bound: force a
        flush (publish_now returned True)."""
        await self._flush_pending(force_flush=True)

    async def _write_large(self, subject: str, reply: str, block: bytes | None,
                           payload: bytes) -> None:
        """Send a large publication without joining its payload into a command.

        When the socket has taken everything so far, it is written now, after what
        is pending (held writes too: they only wait to share a write), as its protocol
        line (and block), the payload object, the line's end; then, while the socket
        holds more than its high-water mark, this waits for it to take it, as
        nats-py's flusher waits, so a camera's next frame is not copied into the
        transport's buffer behind this one. Otherwise the three pieces join the
        pending buffer, for nats-py's flusher or the reconnect. The wait is in steps
        of WRITE_WAIT_SECONDS and ends when the connection does: a connection that
        died is not closed by nats-py's reconnect, and a wait on it alone would hang
        the publish for good."""
        size = len(payload)
        if block is None:
            line = f"PUB {subject} {reply} {size}\r\n".encode()
        else:
            line = f"HPUB {subject} {reply} {len(block)} {len(block) + size}\r\n".encode()
            line += block
        ours = self._transport
        transport = getattr(getattr(ours, "_io_writer", None), "transport", None)
        if (ours is None or transport is None or not self.is_connected
                or transport.is_closing() or transport.get_write_buffer_size()):
            self._pending += (line, payload, b"\r\n")
            self._pending_data_size += len(line) + size + 2
            return
        live: asyncio.WriteTransport = transport
        self._pending.append(line)
        live.write(b"".join(self._pending))
        self._pending = []
        self._pending_data_size = 0
        live.write(payload)
        live.write(b"\r\n")
        high = live.get_write_buffer_limits()[1]
        while (live.get_write_buffer_size() > high and self.is_connected
               and not live.is_closing()
               and getattr(getattr(ours, "_io_writer", None), "transport", None) is live):
            try:
                await asyncio.wait_for(ours.drain(), WRITE_WAIT_SECONDS)
            except (asyncio.TimeoutError, OSError):
                continue  # the loop's test decides: still this live connection?

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes,
                           headers: bytes) -> None:
        sub = self._subs.get(sid)
        inline = None if sub is None else sub._pending_queue
        if type(inline) is not InlineQueue:
            await super()._process_msg(sid, subject, reply, data, headers)
            return
        stats = self.stats
        stats["in_msgs"] += 1
        stats["in_bytes"] += len(data)
        sub._received += 1
        parsed = None
        if headers:
            parsed = plain_headers(headers) or await super()._process_headers(headers)
        inline.put_nowait(self._build_message(sid, subject, reply, data, parsed))

    async def _read_loop(self) -> None:
        reader = getattr(self._transport, "_io_reader", None)
        if isinstance(reader, asyncio.StreamReader) and all(
                hasattr(reader, name) for name in READER_STATE):
            InlineReads(self, reader)
        await super()._read_loop()

    def hold_writes(self) -> None:
        """Leave what is published from here on in the pending buffer, for write_held
        to write: a batch of publications and settlements made on one pass of the
        loop then goes out in one write on that pass, where nats-py's flusher task
        would write it on the loop's next pass (a pass more on every hop). A publish
        whose headers nats-py encodes itself (not a HeaderBlock) still asks the flusher,
        which then writes what is held with it, earlier."""
        self._holding += 1

    def write_held(self) -> None:
        """End a hold_writes: write the pending buffer to the socket now, or have the
        flusher write it when the socket is backed up (it waits for room) or the
        connection is not up (nats-py writes it once reconnected)."""
        self._holding -= 1
        if self._holding or not self._pending:
            return
        ours = self._transport
        transport = getattr(getattr(ours, "_io_writer", None), "transport", None)
        if (ours is not None and self.is_connected and transport is not None
                and not transport.get_write_buffer_size()):
            ours.writelines(self._pending)
            self._pending = []
            self._pending_data_size = 0
        elif self._flush_queue is not None and self._flush_queue.empty():
            self._flush_queue.put_nowait(asyncio.get_running_loop().create_future())

    async def _process_headers(self, headers: bytes) -> dict[str, str] | None:
        if headers:
            parsed = plain_headers(headers)
            if parsed:
                return parsed
        result: dict[str, str] | None = await super()._process_headers(headers)
        return result


class InlineQueue:
    """Stands in for a subscription's message queue (nats-py's _process_msg puts every
    message of a subscription on it, and a task per subscription takes them off to
    await its callback): each message goes to dispatch at once instead, inside the
    read loop -- a queue put, a task wake-up and a coroutine call per message cost
    more than handlers that only park a delivery or fill in a receipt.
    FastHeadersClient hands such a subscription's messages over without the rest of
    nats-py's _process_msg (no JetStream flow control or slow-consumer accounting
    applies to it). dispatch must not block, and what it raises is logged, never let
    into the read loop (which would close the connection)."""

    __slots__ = ("_dispatch",)

    def __init__(self, dispatch: Callable[[Msg], None]) -> None:
        self._dispatch = dispatch

    def put_nowait(self, msg: Msg) -> None:
        try:
            self._dispatch(msg)
        except Exception:
            logger.exception("an inline subscription's handler failed")

    def qsize(self) -> int:
        return 0

    def empty(self) -> bool:
        return True

    def task_done(self) -> None:
        return None

    async def join(self) -> None:
        return None


CLIENT_CLASS: Final[type[TlsClient]] = FastHeadersClient if FAST_HEADERS else TlsClient
"""The client class to connect with: FastHeadersClient where this nats-py allows."""


async def connect(servers: str | list[str], **options: Any) -> NatsClient:
    """nats.connect, with a CLIENT_CLASS client.

    Raises:
        as nats.connect.
    """
    client = CLIENT_CLASS()
    await client.connect(servers, **options)
    return client


__all__ = ["CLIENT_CLASS", "FAST_HEADERS", "LARGE_PAYLOAD",
           "FastHeadersClient", "HeaderBlock", "TlsClient", "connect",
           "encode_headers", "plain_headers", "written_as_is"]
