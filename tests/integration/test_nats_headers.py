"""broker.client's header fast paths against nats-py's own results, on a real
nats-server: what the fast client writes is the block nats-py writes for the same
pairs, what it reads is the dict nats-py reads from the same block, and where the
fast path does not apply nats-py's way is taken."""

from __future__ import annotations

from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient

from videoflow.backends.jetstream.outcomes import publish_headers
from videoflow.backends.messaging_types import ChannelId, Envelope
from videoflow.broker import client as fast
from videoflow.broker.link import connect as link_connect
from videoflow.broker.loop import registered
from videoflow.broker.server import EmbeddedServer

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

WRITTEN: list[dict[str, str]] = [
    {"traceparent": TRACEPARENT},
    {"Nats-Msg-Id": "numbers:src:41", "traceparent": TRACEPARENT},
    {"Nats-Msg-Id": ""},                              # an empty value
    {"X-Odd": "a  b"},                                # spaces inside are kept
    # nats-py changes these, so they take its way: ends stripped, CR/LF to spaces,
    # non-ASCII, a name with a character outside the token set (refused).
    {"X-Padded": " v "},
    {"X-Lines": "a\r\nb"},
    {"X-Text": "caf\u00e9"},
    {"X-Tab": "a\tb"},
]

READ: list[bytes] = [
    b"NATS/1.0\r\ntraceparent: " + TRACEPARENT.encode() + b"\r\n\r\n",
    b"NATS/1.0\r\nNats-Msg-Id: m1\r\ntraceparent: " + TRACEPARENT.encode() + b"\r\n\r\n",
    b"NATS/1.0\r\nA:b\r\nC :  d \r\n\r\n",                 # no space, spaces around
    b"NATS/1.0\r\nA: 1\r\nA: 2\r\n\r\n",                   # the last of a repeated name
    b"NATS/1.0\r\nA: \r\n\r\n",                            # an empty value
    b"NATS/1.0\r\nno colon here\r\nB: x\r\n\r\n",          # a line without ':' skipped
    b"NATS/1.0\r\nA B: x\r\nC: y\r\n\r\n",                 # a name with a space skipped
    b"NATS/1.0\r\nA\x1cB: x\r\n\r\n",                      # str.isspace, not bytes'
    b"NATS/1.0\r\nA:\tx\t\r\n\r\n",                        # tabs stripped
    b"NATS/1.0\r\nA: caf\xc3\xa9\r\n\r\n",                 # non-ASCII: nats-py's way
    b"NATS/1.0\r\nA: \xff\r\n\r\n",                        # undecodable: nats-py's way
    b"NATS/1.0 408 Request Timeout\r\n\r\n",               # a status: nats-py's way
    b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 4\r\n\r\n",
    b"NATS/1.0\r\n\r\n",                                   # no pair at all
]


class Recording(NatsClient):
    """A plain nats-py client that keeps each received message's raw header block."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: list[bytes] = []

    async def _process_headers(self, headers: bytes) -> dict[str, str] | None:
        self.blocks.append(bytes(headers or b""))
        result: dict[str, str] | None = await super()._process_headers(headers)
        return result


def test_this_nats_py_takes_the_fast_paths() -> None:
    # The fast paths override private nats-py methods; a nats-py whose methods moved
    # would quietly lose them (correct, but slow). This says so when it happens.
    assert fast.FAST_HEADERS, "nats-py's _send_publish/_process_headers changed"
    assert fast.CLIENT_CLASS is fast.FastHeadersClient


@pytest.mark.parametrize("pairs", WRITTEN, ids=lambda p: ",".join(f"{k}={v!r}" for k, v in
                                                                 p.items()))
@pytest.mark.asyncio
async def test_a_published_block_is_what_nats_py_writes(pairs: dict[str, str],
                                                        nats_server: EmbeddedServer) -> None:
    reader = Recording()
    await reader.connect(nats_server.url)
    sub = await reader.subscribe("h.>")
    await registered(reader, 5)  # before another connection publishes
    ours = await fast.connect(nats_server.url)
    theirs = await nats.connect(nats_server.url)
    try:
        encoded = fast.encode_headers(pairs)
        assert dict(encoded) == pairs
        plain = all(v.isascii() and v.isprintable() and v == v.strip() for v in pairs.values())
        assert isinstance(encoded, fast.HeaderBlock) == plain
        await ours.publish("h.ours", b"data", headers=encoded)
        await ours.flush()
        await theirs.publish("h.theirs", b"data", headers=pairs)
        await theirs.flush()
        got = [await sub.next_msg(timeout=5), await sub.next_msg(timeout=5)]
    finally:
        for client in (ours, theirs, reader):
            await client.close()
    # Two connections: either may arrive first. The blocks are in arrival order.
    by = {m.subject: (m, block) for m, block in zip(got, reader.blocks, strict=True)}
    (mine, mine_block), (other, other_block) = by["h.ours"], by["h.theirs"]
    assert mine_block == other_block
    assert mine.headers == other.headers and mine.data == other.data == b"data"
    if isinstance(encoded, fast.HeaderBlock):
        assert mine_block == encoded.block


@pytest.mark.parametrize("block", READ, ids=lambda b: repr(b[10:40]))
@pytest.mark.asyncio
async def test_a_received_block_reads_as_nats_py_reads_it(block: bytes) -> None:
    ours = await fast.FastHeadersClient()._process_headers(block)
    theirs = await NatsClient()._process_headers(block)
    assert ours == theirs
    # The fast path read it itself when it is ASCII, without a status, with a pair.
    took = fast.plain_headers(block)
    assert (took is not None) == (block.isascii() and block.startswith(b"NATS/1.0\r\n")
                                  and bool(theirs))


@pytest.mark.asyncio
async def test_a_message_from_any_publisher_reads_the_same(nats_server: EmbeddedServer) -> None:
    # What a plain nats-py publisher writes, the fast client reads as nats-py does.
    ours = await fast.connect(nats_server.url)
    plain = await nats.connect(nats_server.url)
    theirs = await nats.connect(nats_server.url)
    try:
        subs = [await ours.subscribe("any"), await plain.subscribe("any")]
        await registered(ours, 5)
        await registered(plain, 5)
        sent: list[dict[str, Any]] = [{"traceparent": TRACEPARENT, "B": " x "},
                                      {"X-Text": "caf\u00e9"}]
        for headers in sent:
            await theirs.publish("any", b"m", headers=headers)
        await theirs.flush()
        for _ in sent:
            a, b = [await s.next_msg(timeout=5) for s in subs]
            assert a.headers == b.headers
    finally:
        for client in (ours, plain, theirs):
            await client.close()


@pytest.mark.asyncio
async def test_jetstream_deduplicates_on_an_encoded_msg_id(nats_server: EmbeddedServer) -> None:
    client = await link_connect(nats_server.url, 5.0, _ignore)
    try:
        assert type(client) is fast.FastHeadersClient  # every videoflow connection
        js = client.jetstream()
        await js.add_stream(name="H", subjects=["h"])
        headers = fast.encode_headers({"Nats-Msg-Id": "one", "traceparent": TRACEPARENT})
        first = await js.publish("h", b"1", headers=headers)
        again = await js.publish("h", b"1", headers=headers)
        # nats-py leaves duplicate None when the broker did not say true.
        assert (bool(first.duplicate), again.duplicate, again.seq) == (False, True, first.seq)
        stored = await js.get_msg("H", first.seq)
        assert stored.headers == {"Nats-Msg-Id": "one", "traceparent": TRACEPARENT}
    finally:
        await client.close()


MSG_IDS = ["numbers:src:41", "cam0:7f3a:12", "a b", " lead", "trail ", "caf\u00e9",
           "tab\there"]


@pytest.mark.parametrize("msg_id", MSG_IDS)
@pytest.mark.parametrize("traceparent", [TRACEPARENT, " " + TRACEPARENT])
def test_an_outputs_headers_are_the_block_encode_headers_makes(msg_id: str,
                                                                traceparent: str) -> None:
    # publish_headers writes an output's Nats-Msg-Id and traceparent itself: the same
    # pairs, and the same block where encode_headers makes one (which the test above
    # holds to nats-py's), else the plain pairs for nats-py to encode.
    envelope = Envelope(ChannelId("f", "r", "n"), "data", b"x", msg_id=msg_id,
                        traceparent=traceparent)
    made = publish_headers(envelope)
    pairs = {"Nats-Msg-Id": msg_id, "traceparent": traceparent}
    expected = fast.encode_headers(pairs)
    assert made == pairs and type(made) is type(expected)
    if isinstance(expected, fast.HeaderBlock):
        assert isinstance(made, fast.HeaderBlock) and made.block == expected.block


@pytest.mark.asyncio
async def test_publish_now_writes_what_publish_writes(nats_server: EmbeddedServer) -> None:
    reader = await nats.connect(nats_server.url)
    sub = await reader.subscribe("now.>")
    await registered(reader, 5)
    client = await fast.connect(nats_server.url)
    try:
        assert isinstance(client, fast.FastHeadersClient)
        headers = fast.encode_headers({"Nats-Msg-Id": "m-1", "traceparent": TRACEPARENT})
        sent = [("now.a", "_INBOX.r.1", b"payload", headers), ("now.b", "", b"", None),
                ("now.c", "_INBOX.r.2", bytes(range(256)) * 200, None)]
        client.hold_writes()
        for subject, reply, payload, block in sent:
            await client.publish(subject, payload, reply=reply, headers=block)
        theirs, client._pending = client._pending, []
        client._pending_data_size = 0
        for subject, reply, payload, block in sent:
            assert client.publish_now(subject, reply, payload, block) is False
        assert b"".join(client._pending) == b"".join(theirs)
        client.write_held()
        for subject, reply, payload, block in sent:
            got = await sub.next_msg(timeout=5)
            assert (got.subject, got.reply, got.data) == (subject, reply, payload)
            assert got.headers == (None if block is None else dict(block))
    finally:
        await client.close()
        await reader.close()
    with pytest.raises(nats.errors.ConnectionClosedError):
        client.publish_now("now.a", "", b"x", None)


@pytest.mark.asyncio
async def test_publish_now_refuses_what_publish_refuses(nats_server: EmbeddedServer) -> None:
    client = await fast.connect(nats_server.url)
    try:
        assert isinstance(client, fast.FastHeadersClient)
        with pytest.raises(ValueError, match="under"):
            client.publish_now("now.a", "", bytes(fast.LARGE_PAYLOAD), None)
        with pytest.raises(ValueError, match="HeaderBlock"):
            client.publish_now("now.a", "", b"x", {"X-Padded": " v "})
        client._max_payload = 4  # as a server with a small max_payload says
        with pytest.raises(nats.errors.MaxPayloadError):
            client.publish_now("now.a", "", b"12345", None)
        if fast._VALIDATE_SUBJECT is not None:  # nats-py 2.16 on checks subjects
            with pytest.raises(nats.errors.BadSubjectError):
                client.publish_now("now a", "", b"x", None)
    finally:
        await client.close()


async def _ignore(error: BaseException) -> None:
    return None
