"""Payload stores that keep obligations (RFC 0006 BLOB-14).

A payload too large to travel inline in an envelope is put in a PayloadStore and the
envelope carries its ref (``blob_ref``). Unlike the counter store
(videoflow.wire.serialization.BlobStore), a PayloadStore knows *who* still owes a
release: every put acquires one obligation per reader id and one for the publisher's
intent (``intent/<publication_id>``); a ref is reclaimed exactly when its last
obligation goes, or when its TTL lapses (BLOB-5, BLOB-7).

Obligation ids are plain strings. Reader ids are the ones the compiler hands the
publisher (``<child>`` per competing child, ``<child>/p<i>`` per partitioned
replica); ``intent/*`` is the publisher's own; ``archive/*`` and ``dlq/*`` are pins
added later with ``acquire`` and never cancelled by reconciliation.

This module holds the contract (PayloadStore, its records and the offload and TTL
rules) and MemoryPayloadStore (dies with the process). The other stores live beside
it: FilesystemPayloadStore (videoflow.backends.filesystem_payload: a directory,
records beside the blobs, survives a restart), shared memory on one host
(videoflow.backends.shm_payload), and the JetStream adapter's NatsObjectPayloadStore
(videoflow.backends.jetstream.payloads), shared by every worker on the broker. Every
public method is synchronous, like the rest of the backend contract.

Over ~700 lines: the contract is one class whose every public method states its
rule, with the primitives each store implements; MemoryPayloadStore is the rest.
"""

from __future__ import annotations

import abc
import contextlib
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, TypeVar

import msgspec

from videoflow.core.constants import BATCH, REALTIME
from videoflow.errors import (
    BrokerUnavailable,
    PayloadMissing,
    UnobservableState,
)
from videoflow.wire.offload import GatheredMessage

__all__ = [
    "BATCH_TTL_SECONDS",
    "ENVELOPE_MARGIN_BYTES",
    "MemoryPayloadStore",
    "PayloadRecord",
    "PayloadStore",
    "REALTIME_TTL_SECONDS",
    "default_ttl_seconds",
    "inline_threshold",
    "intent_id",
    "should_offload",
]

T = TypeVar("T")

REALTIME_TTL_SECONDS: Final = 3600.0
"""BLOB-7: how long a realtime flow's payload may outlive its readers."""

BATCH_TTL_SECONDS: Final = 86400.0
"""BLOB-7: how long a batch flow's payload may outlive its readers."""

ENVELOPE_MARGIN_BYTES: Final = 16 * 1024
"""Room kept below the broker's max_payload for everything but the message: the
envelope's other fields, user metadata and the publish headers (Nats-Msg-Id), which
count against max_payload too (NATS_FACTS S9)."""

INTENT_PREFIX: Final = "intent/"
PINNED_PREFIXES: Final = ("archive/", "dlq/")
"""Obligations reconciliation never cancels (an archive's or a dead-letter pin's)."""

REF_PATTERN = re.compile(r"^[0-9a-f]{32}$")
"""A payload ref: 32 lowercase hex digits (a uuid4 without dashes)."""
# Refs are uuid4 hex: a valid file name, KV key and object name everywhere, and a
# caller-supplied ref that is not one (a path, say) is unknown before it reaches disk.


def default_ttl_seconds(flow_type: str) -> float:
    """The BLOB-7 TTL default for a flow type.

    Arguments:
        flow_type: videoflow.core.constants.REALTIME or BATCH.

    Returns:
        3600.0 for realtime, 86400.0 for batch.

    Raises:
        ValueError: for any other flow type.
    """
    if flow_type == REALTIME:
        return REALTIME_TTL_SECONDS
    if flow_type == BATCH:
        return BATCH_TTL_SECONDS
    raise ValueError(f"flow_type must be {REALTIME!r} or {BATCH!r}, not {flow_type!r}")


def intent_id(publication_id: str) -> str:
    """The obligation id of a publisher's intent for one publication."""
    return INTENT_PREFIX + publication_id


def inline_threshold(max_payload: int, margin: int = ENVELOPE_MARGIN_BYTES) -> int:
    """The largest message that still travels inline under a broker's max_payload.

    Arguments:
        max_payload: the broker's limit in bytes (a connected nats client's
            ``max_payload``, read from the server's INFO).
        margin: bytes kept for the rest of the envelope and the headers.

    Returns:
        max_payload - margin.

    Raises:
        ValueError: if max_payload is not an int larger than margin, or margin < 0.
    """
    if isinstance(max_payload, bool) or not isinstance(max_payload, int):
        raise ValueError(f"max_payload must be an int, not {max_payload!r}")
    if margin < 0 or max_payload <= margin:
        raise ValueError(f"max_payload {max_payload} leaves no room above a {margin}-byte margin")
    return max_payload - margin


def should_offload(size: int, threshold: int) -> bool:
    """Whether a message of size bytes must travel by ref rather than inline.

    Arguments:
        size: the encoded message's length in bytes.
        threshold: what inline_threshold returned.
    """
    return size > threshold


@dataclass(frozen=True)
class PayloadRecord:
    """What a store keeps about one ref (the BLOB-14 ledger entry).

    Attributes:
        obligations: every obligation still held.
        readers: the reader obligations the put acquired; a refused publication
            drops whichever of them remain (PAY-013).
        publication_id: the publication the put was for.
        expires_at: wall-clock seconds (the store's clock) after which the ref is
            reclaimed whatever is still held (BLOB-7).
        size: the payload's length in bytes.
        channel: the publishing node, when the put named it (a store that keeps
            its own outbox, keeps_outbox).
        stream_seq: the publication's stream sequence once it was accepted, when
            resolve_intent was told it; None while unresolved.
        writer: the (node, replica) whose share of a budgeted store the bytes are
            charged to (a pass-through's second name: the source's writer); None in a
            store without shares, and in records written before they were kept.
    """

    obligations: frozenset[str]
    readers: frozenset[str]
    publication_id: str
    expires_at: float
    size: int
    channel: str | None = None
    stream_seq: int | None = None
    writer: tuple[str, int] | None = None

    def to_json(self) -> bytes:
        fields: dict[str, Any] = {
            "obligations": sorted(self.obligations),
            "readers": sorted(self.readers),
            "publication_id": self.publication_id,
            "expires_at": self.expires_at,
            "size": self.size,
        }
        if self.channel is not None:
            fields["channel"] = self.channel
        if self.stream_seq is not None:
            fields["stream_seq"] = self.stream_seq
        if self.writer is not None:
            fields["writer"] = list(self.writer)
        return _JSON_ENCODER.encode(fields)  # compact JSON, as json.dumps writes it

    @classmethod
    def from_json(cls, data: bytes, ref: str) -> PayloadRecord:
        """Decodes a stored record.

        Raises:
            UnobservableState: reason 'malformed' when the bytes are not a record.
        """
        try:
            raw = _JSON_DECODER.decode(data)
            return cls(
                obligations=frozenset(_strings(raw["obligations"])),
                readers=frozenset(_strings(raw["readers"])),
                publication_id=str(raw["publication_id"]),
                expires_at=float(raw["expires_at"]),
                size=int(raw["size"]),
                channel=None if raw.get("channel") is None else str(raw["channel"]),
                stream_seq=None if raw.get("stream_seq") is None else int(raw["stream_seq"]),
                writer=_writer(raw.get("writer")),
            )
        except (ValueError, TypeError, KeyError) as error:  # msgspec.DecodeError is one
            raise UnobservableState(
                f"the obligation record of payload {ref} is unreadable",
                reason="malformed",
                detail=str(error),
            ) from error


# msgspec's JSON: a record is read or written several times per frame, and the
# standard library's json took five to ten times as long for the same bytes.
_JSON_ENCODER: Final = msgspec.json.Encoder()
_JSON_DECODER: Final = msgspec.json.Decoder()


def _writer(value: Any) -> tuple[str, int] | None:
    if value is None:
        return None
    if (not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], str)
            or not isinstance(value[1], int) or isinstance(value[1], bool)):
        raise TypeError(f"expected a [node, replica] pair, got {value!r}")
    return (value[0], value[1])


def _strings(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"expected a list of strings, got {value!r}")
    return value


Change = Callable[[PayloadRecord | None], tuple[PayloadRecord | None, T]]
"""A pure function from a ref's current record to (its next record, a result); None
as the next record reclaims the ref. Stores may call it more than once (a lost
compare-and-swap), so it must not touch anything else."""


class PayloadStore(abc.ABC):
    """Bytes under refs, each held by named obligations (RFC 0006 BLOB-14).

    Subclasses supply storage primitives; the obligation rules live here once.

    Arguments:
        flow_type: REALTIME or BATCH; picks the BLOB-7 TTL default.
        ttl_seconds: the TTL of every put that names none; None takes the default.
        clock: wall-clock seconds, injectable for tests. Wall clock rather than
            monotonic because expiry times outlive the process in the durable stores.

    Attributes:
        reclaimed: how many refs this instance reclaimed (other processes sharing the
            store count their own).
        offload_above: payloads larger than this are cheaper by ref through this store
            than inline through the broker; None: only those over the broker's
            inline limit go by ref.
    """

    offload_above: int | None = None
    keeps_outbox: bool = False
    """Whether the records are the publisher's outbox (channel and stream_seq kept
    in them), so reconciliation reads them instead of the run ledger's: a store whose
    records share the payload's fate needs no second, remote copy of them."""
    shares_bytes: bool = False
    """Whether put_from gives a new ref the bytes of another without a copy."""
    writes_gathered: bool = False
    """Whether put writes a GatheredMessage's pieces as they are (one copy of each
    frame); the other stores take its joined bytes."""

    def __init__(
        self,
        *,
        flow_type: str = REALTIME,
        ttl_seconds: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ttl_seconds = _checked_ttl(
            default_ttl_seconds(flow_type) if ttl_seconds is None else ttl_seconds
        )
        self.clock = clock
        self.reclaimed = 0
        self._count_lock = threading.Lock()

    # --- storage primitives ------------------------------------------------------

    @abc.abstractmethod
    def _transact(self, ref: str, change: Change[T]) -> tuple[T, bool]:
        """Atomically apply change to ref's record; return its result and whether
        this call deleted the record."""

    @abc.abstractmethod
    def _read_record(self, ref: str) -> PayloadRecord | None: ...

    @abc.abstractmethod
    def _write_blob(self, ref: str, data: bytes) -> None: ...

    def _write_gathered(self, ref: str, data: GatheredMessage) -> None:
        """Write a gathered message's pieces as ref's bytes (a store that
        writes_gathered)."""
        raise NotImplementedError

    @abc.abstractmethod
    def _read_blob(self, ref: str) -> bytes | None: ...

    @abc.abstractmethod
    def _drop_blob(self, ref: str) -> None:
        """Delete ref's bytes; an absent blob is not an error."""

    @abc.abstractmethod
    def _list_refs(self) -> list[str]:
        """Every ref that has a record."""

    @abc.abstractmethod
    def _list_blobs(self) -> list[str]:
        """Every ref that has bytes."""

    def close(self) -> None:  # noqa: B027 - only the NATS store holds anything open
        """Release whatever the store holds open (connections, threads). Idempotent."""

    def __enter__(self) -> PayloadStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- the contract -------------------------------------------------------------

    def put(
        self,
        data: bytes | bytearray | memoryview | GatheredMessage,
        reader_ids: Sequence[str],
        publication_id: str,
        *,
        ttl_seconds: float | None = None,
        channel: str | None = None,
        while_waiting: Callable[[], None] | None = None,
    ) -> str:
        """Stores a payload, acquiring its reader obligations and the publisher's intent.

        Arguments:
            data: the payload bytes (copied); a GatheredMessage is its joined bytes.
            reader_ids: one obligation per reader that will read the ref
                (blob_reader_ids); may be empty when nobody reads it.
            publication_id: the publication that will carry the ref; acquires
                ``intent/<publication_id>``, owed until resolve_intent.
            ttl_seconds: this ref's TTL; None takes the store's.
            channel: the publishing node, kept in the record (keeps_outbox).
            while_waiting: called between polls while a budgeted store waits for room:
                the publisher's chance to resolve what it holds (its own intents
                are among what can make room).

        Returns:
            The new ref.

        Raises:
            ValueError: an empty or duplicate reader id, a reader id in the intent
                namespace, an empty publication id, or a TTL that is not > 0.
        """
        if self.writes_gathered and isinstance(data, GatheredMessage):
            gathered = data
            return self._store(len(gathered), lambda ref: self._write_gathered(ref, gathered),
                               reader_ids, publication_id, ttl_seconds, channel,
                               while_waiting)
        blob = data if isinstance(data, bytes) else bytes(data)
        return self._store(len(blob), lambda ref: self._write_blob(ref, blob), reader_ids,
                           publication_id, ttl_seconds, channel, while_waiting)

    def put_from(
        self,
        source: str,
        reader_ids: Sequence[str],
        publication_id: str,
        *,
        ttl_seconds: float | None = None,
        channel: str | None = None,
        while_waiting: Callable[[], None] | None = None,
    ) -> str:
        """Stores the payload source holds again, under a ref of its own with its own
        obligations and intent (put's arguments): for a node that publishes what it
        read. Without a copy where the store shares bytes between refs (shares_bytes:
        the filesystem and shared-memory stores link the file), else read and put.
        Shared bytes are in a budgeted store's budget once, however many refs name
        them: the new ref takes none of it (while_waiting is then never called).

        Raises:
            PayloadMissing: source is unknown, reclaimed or expired.
            ValueError: as put.
        """
        if not self.shares_bytes:
            return self.put(self.get(source), reader_ids, publication_id,
                            ttl_seconds=ttl_seconds, channel=channel,
                            while_waiting=while_waiting)
        size = self._live_record(source).size
        return self._store(size, lambda ref: self._share_blob(source, ref), reader_ids,
                           publication_id, ttl_seconds, channel, None, admit=False)

    def _store(self, size: int, write: Callable[[str], None], reader_ids: Sequence[str],
               publication_id: str, ttl_seconds: float | None, channel: str | None,
               while_waiting: Callable[[], None] | None, *, admit: bool = True) -> str:
        """put's work, with the bytes written by write(ref); admit=False for bytes
        already held (a second name for them, put_from), which the budget counts
        already."""
        readers = _checked_readers(reader_ids)
        if not isinstance(publication_id, str) or not publication_id:
            raise ValueError(f"publication_id must be a non-empty str, not {publication_id!r}")
        ttl = self.ttl_seconds if ttl_seconds is None else _checked_ttl(ttl_seconds)
        if admit:
            self._admit(size, while_waiting)
        ref = uuid.uuid4().hex
        record = PayloadRecord(
            obligations=readers | {intent_id(publication_id)},
            readers=readers,
            publication_id=publication_id,
            expires_at=self.clock() + ttl,
            size=size,
            channel=channel,
        )
        try:
            # The record goes first: bytes without a record would belong to nobody,
            # while a record without bytes (a crash in between) is reclaimed by its TTL.
            self._transact(ref, lambda _old: (record, None))
            try:
                write(ref)
            except Exception:
                with contextlib.suppress(OSError, BrokerUnavailable, UnobservableState):
                    self._mutate(ref, lambda _old: (None, None))
                raise
        except Exception:
            # A failed write leaves no bytes (each store's writer removes what it
            # began), so no reclamation frees the room reserved for them: give it back.
            # (Not on an interrupt, which may land after the bytes are in place: a
            # reservation left too high is corrected by the budget's recount, one
            # given back twice would let the budget be overrun.)
            if admit:
                self._unadmit(size)
            raise
        return ref

    def _share_blob(self, source: str, ref: str) -> None:
        """Give ref the bytes of source without copying them (a store that
        shares_bytes).

        Raises:
            PayloadMissing: source's bytes are gone.
        """
        raise NotImplementedError

    def _admit(self, size: int,  # noqa: B027 - only a budgeted store waits
               while_waiting: Callable[[], None] | None) -> None:
        """Wait until a payload of size bytes fits the store's budget, and reserve it
        (the shared-memory store); unbounded stores admit everything."""

    def _unadmit(self, size: int) -> None:  # noqa: B027 - only a budgeted store reserves
        """Give back what _admit reserved for bytes that were never written."""

    def view(self, ref: str) -> memoryview:
        """A payload's bytes as a read-only buffer: the stored bytes themselves where
        the store can map them (the shared-memory store), else a view of a copy.
        Messages decoded from it hold zero-copy arrays of it.

        Raises:
            PayloadMissing: as get.
        """
        return memoryview(self.get(ref)).toreadonly()

    def get(self, ref: str) -> bytes:
        """Fetches a payload.

        Raises:
            PayloadMissing: ref was never put here, was reclaimed, or its TTL lapsed.
        """
        record = self._live_record(ref)
        data = self._read_blob(ref)
        if data is None:
            raise PayloadMissing(f"payload {ref} has no bytes (reclaimed)", ref=ref)
        return self._payload_of(ref, data, record.size)

    def _payload_of(self, ref: str, data: bytes, size: int) -> bytes:
        """The payload in the bytes stored for ref, whose record says size.

        Raises:
            UnobservableState: the bytes do not hold it.
        """
        if len(data) != size:
            raise UnobservableState(
                f"payload {ref} holds {len(data)} bytes, its record says {size}",
                reason="malformed",
            )
        return data

    def obligations(self, ref: str) -> tuple[str, ...]:
        """The obligations still held on ref, sorted.

        Raises:
            PayloadMissing: ref is unknown, reclaimed or expired — never reported as
                an empty tuple, which would read as "nothing owed".
        """
        return tuple(sorted(self._live_record(ref).obligations))

    def records(self) -> dict[str, PayloadRecord]:
        """Every ref's record, as it is now (refs reclaimed meanwhile are left out)."""
        found = ((ref, self._read_record(ref)) for ref in self._list_refs())
        return {ref: record for ref, record in found if record is not None}

    def refs(self) -> tuple[str, ...]:
        """Every ref that has a record (expired ones included until reclaim_expired)."""
        return tuple(sorted(self._list_refs()))

    def acquire(self, ref: str, obligation_id: str, *, ttl_seconds: float | None = None) -> bool:
        """Adds an obligation to a live ref: an archive's or a dead-letter pin.

        Arguments:
            ref: the payload.
            obligation_id: e.g. ``dlq/<node>``.
            ttl_seconds: when given, the ref lives at least this long from now (a
                dead letter's payload must cover DLQ retention, BLOB-14 step 3).

        Returns:
            True if the obligation is new, False if it was already held.

        Raises:
            PayloadMissing: ref is gone (a reclaimed payload cannot be pinned).
            ValueError: an empty obligation id or a TTL that is not > 0.
        """
        _checked_id(obligation_id)
        now = self.clock()
        expires = None if ttl_seconds is None else now + _checked_ttl(ttl_seconds)

        def change(old: PayloadRecord | None) -> tuple[PayloadRecord | None, bool]:
            if old is None or old.expires_at <= now:
                return old, False
            if obligation_id in old.obligations and (expires is None or expires <= old.expires_at):
                return old, False
            until = old.expires_at if expires is None else max(old.expires_at, expires)
            new = replace(old, obligations=old.obligations | {obligation_id}, expires_at=until)
            return new, obligation_id not in old.obligations

        # Read the record first so a missing ref is an error, not a silent no-op.
        self._live_record(ref)
        return self._mutate(ref, change)

    def release(self, ref: str, obligation_id: str) -> bool:
        """Releases one obligation; the ref is reclaimed when it was the last.

        Call it for a reader only after its settlement is confirmed (PAY-004).

        Arguments:
            ref: the payload.
            obligation_id: a reader id from the put, or a pin from acquire.

        Returns:
            True if this call released the obligation; False if it was not held
            (already released, or the ref is gone) — so releasing twice is harmless.
        """
        _checked_id(obligation_id)
        return self._remove(ref, obligation_id)

    def release_many(self, refs: Sequence[str], obligation_id: str) -> list[bool]:
        """release(ref, obligation_id) for each of refs (one reader done with several
        payloads: a group's frames, whose settlements were confirmed together).

        Returns:
            per ref, in order, what release returned.
        """
        return [self.release(ref, obligation_id) for ref in refs]

    def cancel(self, ref: str, obligation_id: str) -> bool:
        """Cancels an obligation whose release was lost in a crash (PAY-006), on the
        authority of the runtime's obligation ledger.

        Returns:
            True if this call cancelled it; False if it was not held.

        Raises:
            ValueError: for an archive/* or dlq/* pin, which reconciliation never
                cancels.
        """
        _checked_id(obligation_id)
        if obligation_id.startswith(PINNED_PREFIXES):
            raise ValueError(f"reconciliation never cancels a pin ({obligation_id!r})")
        return self._remove(ref, obligation_id)

    def resolve_intent(self, ref: str, publication_id: str, *, accepted: bool,
                       stream_seq: int | None = None) -> bool:
        """Settles the publisher's intent once the publication's outcome is definite.

        An accepted publication releases ``intent/<publication_id>``; the readers now
        owe theirs. A definitely refused one (a final Rejected, never a
        PublicationUnknown) owes nothing: the intent and every reader obligation the
        put acquired go at once, and the ref is reclaimed unless a pin holds it
        (PAY-007, PAY-013). Leave an unresolved publication's intent alone.

        Arguments:
            stream_seq: where an accepted publication was stored, kept in the record
                for reconciliation (keeps_outbox).

        Returns:
            True if the intent was held and is now resolved; False if it was not held.
        """
        intent = intent_id(publication_id)
        if accepted:
            return self._remove(ref, intent, stream_seq=stream_seq)

        def change(old: PayloadRecord | None) -> tuple[PayloadRecord | None, bool]:
            if old is None or intent not in old.obligations:
                return old, False
            left = old.obligations - old.readers - {intent}
            return (replace(old, obligations=left) if left else None), True

        return self._mutate(ref, change)

    def reclaim_expired(self, now: float | None = None) -> int:
        """Reclaims every ref whose TTL lapsed, whatever it still holds (BLOB-7).

        Arguments:
            now: the time to judge by; the store's clock when None.

        Also drops bytes left without a record (a crash between a reclamation's
        record deletion and its blob deletion); those are not counted.

        Returns:
            How many refs this call reclaimed.
        """
        when = self.clock() if now is None else now

        def change(old: PayloadRecord | None) -> tuple[PayloadRecord | None, bool]:
            if old is None or old.expires_at > when:
                return old, False
            return None, True

        reclaimed = sum(1 for ref in self._list_refs() if self._mutate(ref, change))
        # Safe against a concurrent put: put writes the record before the bytes, so
        # bytes without a record were always a reclaimed ref's.
        for ref in self._list_blobs():
            if REF_PATTERN.match(ref) and self._read_record(ref) is None:
                self._drop_blob(ref)
        return reclaimed

    # --- shared machinery ------------------------------------------------------------

    def _live_record(self, ref: str) -> PayloadRecord:
        if not isinstance(ref, str) or not REF_PATTERN.match(ref):
            raise PayloadMissing(f"unknown payload ref {ref!r}", ref=str(ref))
        record = self._read_record(ref)
        if record is None:
            raise PayloadMissing(f"unknown payload ref {ref!r} (never put, or reclaimed)", ref=ref)
        if record.expires_at <= self.clock():
            raise PayloadMissing(f"payload {ref} expired (BLOB-7 TTL)", ref=ref)
        return record

    def _remove(self, ref: str, obligation_id: str, stream_seq: int | None = None) -> bool:
        """Drop one obligation (recording stream_seq with it, when given)."""
        def change(old: PayloadRecord | None) -> tuple[PayloadRecord | None, bool]:
            if old is None or obligation_id not in old.obligations:
                return old, False
            left = old.obligations - {obligation_id}
            if not left:
                return None, True
            seq = old.stream_seq if stream_seq is None else stream_seq
            return replace(old, obligations=left, stream_seq=seq), True

        if not isinstance(ref, str) or not REF_PATTERN.match(ref):
            return False
        return self._mutate(ref, change)

    def _mutate(self, ref: str, change: Change[T]) -> T:
        result, deleted = self._transact(ref, change)
        if deleted:
            # BLOB-5: only the transaction that deleted the record drops the bytes, so
            # concurrent releases never reclaim twice.
            self._drop_blob(ref)
            with self._count_lock:
                self.reclaimed += 1
        return result


def _checked_ttl(ttl: float) -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise ValueError(f"ttl_seconds must be a finite number > 0, not {ttl!r}")
    if not math.isfinite(ttl) or ttl <= 0:
        raise ValueError(f"ttl_seconds must be a finite number > 0, not {ttl!r}")
    return float(ttl)


def _checked_id(obligation_id: str) -> None:
    if not isinstance(obligation_id, str) or not obligation_id:
        raise ValueError(f"an obligation id must be a non-empty str, not {obligation_id!r}")


def _checked_readers(reader_ids: Sequence[str]) -> frozenset[str]:
    if isinstance(reader_ids, str):
        raise ValueError("reader_ids must be a sequence of ids, not one str")
    readers = list(reader_ids)
    for reader in readers:
        _checked_id(reader)
        if reader.startswith(INTENT_PREFIX):
            raise ValueError(f"reader id {reader!r} is in the publisher's intent namespace")
    if len(set(readers)) != len(readers):
        # Two readers under one id would need two releases of one obligation.
        raise ValueError(f"duplicate reader ids in {readers!r}")
    return frozenset(readers)


def apply_change(
    old: PayloadRecord | None, change: Change[T],
) -> tuple[PayloadRecord | None, T, bool]:
    """Runs change; returns (the record to write or None, result, whether to write)."""
    new, result = change(old)
    return new, result, new is not old


class MemoryPayloadStore(PayloadStore):
    """A PayloadStore in this process's memory: tests and single-process flows. Its
    records die with the process."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._lock = threading.Lock()
        self._records: dict[str, PayloadRecord] = {}
        self._blobs: dict[str, bytes] = {}

    def _transact(self, ref: str, change: Change[T]) -> tuple[T, bool]:
        with self._lock:
            old = self._records.get(ref)
            new, result, write = apply_change(old, change)
            if not write:
                return result, False
            if new is None:
                del self._records[ref]
                return result, True
            self._records[ref] = new
            return result, False

    def _read_record(self, ref: str) -> PayloadRecord | None:
        with self._lock:
            return self._records.get(ref)

    def _write_blob(self, ref: str, data: bytes) -> None:
        with self._lock:
            self._blobs[ref] = data

    def _read_blob(self, ref: str) -> bytes | None:
        with self._lock:
            return self._blobs.get(ref)

    def _drop_blob(self, ref: str) -> None:
        with self._lock:
            self._blobs.pop(ref, None)

    def _list_refs(self) -> list[str]:
        with self._lock:
            return list(self._records)

    def _list_blobs(self) -> list[str]:
        with self._lock:
            return list(self._blobs)
