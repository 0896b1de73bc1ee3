"""The run ledger's keys and the records it hands out (RFC 0006 CTRL-4).

key_token escapes a ledger identity into one store-key token (token_text reverses
it) and run_key_filter matches every record of a run; Publication, Checkpoint,
TerminalEntry and PendingHandoff are the records FlowRuntime
(videoflow.core.runtime) stores and returns, each one msgpack value under one key.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

_KEY_SAFE: Final = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_/"
)

PublicationStatus = Literal["unresolved", "accepted", "refused"]


def key_token(text: str) -> str:
    """Escape text into one store-key token, reversibly (token_text).

    NATS KV keys allow only ``[-/_=.a-zA-Z0-9]`` and the dot separates tokens
    (NATS_FACTS §9), while ledger identities (``{node}:{epoch}:{n}``, trace ids,
    group keys) may hold anything: every other byte of the UTF-8 text becomes
    ``=XX`` (hex), ``=`` included, and the empty string becomes a lone ``=``.
    """
    if not text:
        return "="
    return "".join(
        ch if ch in _KEY_SAFE else "".join(f"={b:02X}" for b in ch.encode("utf-8"))
        for ch in text
    )


def token_text(token: str) -> str:
    """The text key_token escaped into token.

    Raises:
        ValueError: token is not something key_token produces.
    """
    if token == "=":
        return ""
    out = bytearray()
    i = 0
    while i < len(token):
        if token[i] == "=":
            out.append(int(token[i + 1:i + 3], 16))
            i += 3
        else:
            out += token[i].encode("ascii")
            i += 1
    return out.decode("utf-8")


class Publication(msgspec.Struct, frozen=True):
    """One outbox entry: a publication this node made and what it obliges.

    Attributes:
        publication_id: the broker dedup id (MSGID-5/6).
        payload_refs: payload store refs the publication carries.
        obligations: the reader obligation ids the payload put acquired.
        status: unresolved (no definite outcome yet: PAY-007, the intent is owed),
            accepted (stream_seq is set) or refused (definitely not stored: PAY-013).
        stream_seq: the accepted stream sequence, else None.
        epoch: the owner epoch that recorded it.
    """

    publication_id: str
    payload_refs: tuple[str, ...] = ()
    obligations: tuple[str, ...] = ()
    status: PublicationStatus = "unresolved"
    stream_seq: int | None = None
    epoch: int = 0


class Checkpoint(msgspec.Struct, frozen=True):
    """A node replica's committed state and the input group it covers (RUN-022).

    Attributes:
        state: the node's state bytes.
        covered_group: the identity of the input group the state includes
            (last_input_key); a redelivery of it is acknowledged, not re-applied.
        output: the publication id of the output committed with this state, if
            any — confirm it on the broker before acknowledging the covered group.
        epoch: the owner epoch that wrote it.
    """

    state: bytes
    covered_group: str
    output: str | None = None
    epoch: int = 0


class TerminalEntry(msgspec.Struct, frozen=True):
    """A delivery ended without a dead letter (DELIV-15).

    Attributes:
        key: the input message identity.
        record_ref: the durable record the termination points at.
        reason: why it was terminated.
        epoch: the owner epoch that logged it.
    """

    key: str
    record_ref: str
    reason: str
    epoch: int = 0


class PendingHandoff(msgspec.Struct, frozen=True):
    """A message whose retry budget is exhausted but whose dead-letter record is not
    written yet: unresolved work the broker will keep redelivering (DELIV-15's
    pending_handoff; observe_subscription counts it).

    Attributes:
        key: the input message identity.
        parent: the parent channel it came from.
        reason: why the dead letter could not be recorded yet.
        epoch: the owner epoch that added it.
    """

    key: str
    parent: str
    reason: str
    epoch: int = 0


def run_key_filter(flow_id: str, run_id: str) -> str:
    """The store-key filter matching every record of one run (for its teardown)."""
    return f"{key_token(flow_id)}.{key_token(run_id)}.>"


__all__ = [
    "Checkpoint",
    "PendingHandoff",
    "Publication",
    "PublicationStatus",
    "TerminalEntry",
    "key_token",
    "run_key_filter",
    "token_text",
]
