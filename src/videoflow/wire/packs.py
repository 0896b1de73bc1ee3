"""Packs: several envelopes in one broker message.

A JetStream message costs the broker and every stage a fixed amount whatever it
carries: on the 2-core bench host, 70 us of nats-server CPU per small message end to
end, more than a Python stage spends on it. A pack carries several envelopes in one
message, so that cost is paid once for all of them. Its members are read, processed and
given up on one by one; the broker message is settled once every member is (see
videoflow.messaging.packs).

A pack is one msgpack array of four elements::

    [0] 4                      the pack tag (an envelope's version is 1-3)
    [1] pack_id                str: its publisher's id for it (its Nats-Msg-Id)
    [2] members                array of bin: each a whole envelope (any version)
    [3] traceparents           array of str | nil, one per member: the member's W3C
                               trace context, as an envelope alone carries it in its
                               traceparent header

written as a fixarray, so a pack's first two bytes are ``94 04`` (PACK_PREFIX); an
envelope never starts so (its version is 1-3), and a reader that knows no packs
rejects one as an envelope of an unknown version. A pack has at least one member and
as many traceparents as members.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

import msgspec

from videoflow.errors import WireError

PACK_TAG: Final = 4

PACK_MEMBERS: Final = 64
"""The most envelopes a videoflow writer puts in one pack."""

PACK_BYTES: Final = 256 * 1024
"""The most member bytes a videoflow writer puts in one pack (below any server's
max_payload)."""
PACK_PREFIX: Final = b"\x94\x04"
"""A pack's first two bytes: a msgpack fixarray of 4, then the positive fixint 4."""

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(tuple[int, str, list[bytes], list[str | None]])


class Pack(NamedTuple):
    """A decoded pack.

    Attributes:
        pack_id: its publisher's id for it.
        members: each member's envelope bytes, in order.
        traceparents: each member's W3C trace context, or None.
    """

    pack_id: str
    members: list[bytes]
    traceparents: list[str | None]


def is_pack(data: bytes | bytearray | memoryview) -> bool:
    """Whether data is a pack (its first two bytes), not an envelope."""
    return data[:2] == PACK_PREFIX


def encode_pack(pack_id: str, members: Sequence[bytes],
                traceparents: Sequence[str | None]) -> bytes:
    """The bytes of a pack.

    Arguments:
        pack_id: the publisher's id for it.
        members: each member's envelope bytes (encode_envelope's).
        traceparents: each member's W3C trace context, or None.

    Raises:
        ValueError: no members, or not one traceparent per member.
    """
    if not members:
        raise ValueError("a pack has at least one member")
    if len(traceparents) != len(members):
        raise ValueError(f"a pack has one traceparent per member: {len(members)} members, "
                         f"{len(traceparents)} traceparents")
    return _ENCODER.encode((PACK_TAG, pack_id, list(members), list(traceparents)))


def pack_split(sizes: Sequence[int]) -> list[int]:
    """How a writer splits envelopes of sizes, in order, into packs: each run as long as
    PACK_MEMBERS and PACK_BYTES allow (a member larger than PACK_BYTES alone). The split
    depends on the sizes only, so the same outputs made again split the same way and
    their packs carry the same ids.

    Returns:
        each run's length, in order (a run of 1 goes as the envelope alone).
    """
    runs: list[int] = []
    count = size = 0
    for member in sizes:
        if count and (count == PACK_MEMBERS or size + member > PACK_BYTES):
            runs.append(count)
            count = size = 0
        count += 1
        size += member
    if count:
        runs.append(count)
    return runs


def decode_pack(data: bytes | bytearray | memoryview) -> Pack:
    """A pack's parts.

    Raises:
        WireError: data is not a whole pack (the prefix, four elements of the types
            above, at least one member, one traceparent per member).
    """
    if not is_pack(data):
        raise WireError("not a pack: it does not start 94 04")
    try:
        tag, pack_id, members, traceparents = _DECODER.decode(data)
    except msgspec.DecodeError as error:
        raise WireError(f"malformed pack: {error}") from None
    if tag != PACK_TAG or not members or len(traceparents) != len(members):
        raise WireError(f"malformed pack: tag {tag}, {len(members)} members, "
                        f"{len(traceparents)} traceparents")
    return Pack(pack_id, members, traceparents)


__all__ = ["PACK_BYTES", "PACK_MEMBERS", "PACK_PREFIX", "PACK_TAG", "Pack", "decode_pack",
           "encode_pack", "is_pack", "pack_split"]
