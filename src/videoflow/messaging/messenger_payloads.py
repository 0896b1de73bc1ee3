"""MessengerPayloads: the by-ref payload side of a node's messenger.

Payloads over the inline limit travel by ref through an obligation-keeping PayloadStore:
put with this node's readers' obligations and its own intent, recorded in the outbox,
the intent resolved by the publication's outcome; a reader releases its obligation only
after its settlement is confirmed (PAY-004).

While receiving, the messenger reconciles payload obligations (RuntimeObligationLedger,
at most once per ack_wait): a release lost when a reader died after a confirmed ack is
cancelled once the broker's ack floor shows it (PAY-006).

The counter BlobStore (blob_store, RFC 0002) works without a payload
store: blob_readers sets how many reads a payload is owed, counted down in the run
ledger by each reader after a confirmed settlement, the last deleting it (BLOB-5).

What to publish, and whether it was published, stays the messenger's
(videoflow.messaging.nats_messenger): this side puts, reads and lets payloads go.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from videoflow import clock
from videoflow.backends.messaging import MessagingBackend
from videoflow.backends.messaging_types import DLQ_RETENTION_SECONDS
from videoflow.backends.payload import PayloadStore
from videoflow.core.runtime import FlowRuntime
from videoflow.messaging.dead_letters import dead_letter_msg_id
from videoflow.messaging.obligations import (
    RuntimeObligationLedger,
    StoreObligationLedger,
    reconcile,
)
from videoflow.wire.offload import BlobStore, GatheredMessage, decode_message, restore_message


class MessengerPayloads:
    """Where one node's by-ref payloads go and come from: the obligation-keeping
    payload store, else the counter store, else none (everything inline).

    Arguments:
        node_name: the node.
        parent_names: its real parents, whose publications reconciliation judges.
        backend: the MessagingBackend whose ack floors reconciliation reads.
        runtime: the node's FlowRuntime ledger (outbox, read counts).
        ack_wait: the durables' lease, in seconds: reconciliation runs at most once per
            ack_wait.
        payload_store: the obligation-keeping PayloadStore, or None.
        blob_store: the counter BlobStore (RFC 0002), used only when payload_store is
            None.
        blob_readers: how many reads each payload put in the counter store is owed
            (BLOB-5); None leaves it to the store's TTL.
        blob_reader_ids: the reader obligations each put in the payload store acquires.
        blob_ttl_seconds: the TTL of those payloads; None for the store's default.
        reader_id: the obligation this node holds on its parents' payloads.
    """

    def __init__(self, node_name: str, parent_names: list[str], backend: MessagingBackend,
                 runtime: FlowRuntime, ack_wait: int, *,
                 payload_store: PayloadStore | None, blob_store: BlobStore | None,
                 blob_readers: int | None, blob_reader_ids: tuple[str, ...],
                 blob_ttl_seconds: int | None, reader_id: str) -> None:
        self.node_name = node_name
        self.parent_names = list(parent_names)
        self.backend = backend
        self.runtime = runtime
        self.ack_wait = ack_wait
        self.payload_store = payload_store
        self.blob_store = None if payload_store is not None else blob_store
        self.blob_readers = blob_readers
        self.blob_reader_ids = blob_reader_ids
        self.blob_ttl_seconds = blob_ttl_seconds
        self.reader_id = reader_id
        self._reconciled_at = float("-inf")
        # What restore handed out, while this node holds it: message id -> (message,
        # ref, its values as they were), so an output that is an input passed on
        # unchanged is stored again without a copy (passed_through).
        self._restored: dict[int, tuple[Any, str, tuple[Any, ...] | None, int]] = {}
        self._restored_by_ref: dict[str, int] = {}  # ref -> its message's id, to forget

    @property
    def offloads(self) -> bool:
        """Whether an output over the inline limit has a store to travel by ref through."""
        return self.payload_store is not None or self.blob_store is not None

    # ------------------------------------------------------------------ the writer

    def put(self, blob: bytes | GatheredMessage, msg_id: str,
            while_waiting: Callable[[], None] | None = None) -> str:
        """Put an output's message (encoded alone, encode_message) where the ref its
        envelope carries will point.

        Into the payload store: with its readers' obligations and this publication's
        intent acquired, and recorded in the outbox (PAY-007/013). Else into the counter
        store: with the reads it is owed recorded in the run ledger (blob_readers; None
        leaves it to the store's TTL; RFC 0002, BLOB-5).

        Arguments:
            blob: the output's message, encode_message's bytes (or gather_message's
                pieces, for a store that writes_gathered).
            msg_id: the publication's msg_id, the intent's name.
            while_waiting: what to do while a budgeted store waits for room (the
                publisher's window resolving what it can).

        Returns:
            The ref.
        """
        if self.payload_store is not None:
            ttl = {} if self.blob_ttl_seconds is None else {"ttl_seconds": self.blob_ttl_seconds}
            store = self.payload_store
            ref = store.put(blob, self.blob_reader_ids, msg_id, channel=self.node_name,
                            while_waiting=while_waiting, **ttl)
            if not store.keeps_outbox:  # else the record just written is the entry
                self.runtime.record_publication(msg_id, (ref,), self.blob_reader_ids)
            return ref
        assert self.blob_store is not None
        ref = self.blob_store.put(bytes(blob))
        if self.blob_readers is not None:
            self.runtime.count_blob_readers(ref, self.blob_readers)
        return ref

    def refused(self, ref: str, msg_id: str) -> None:
        """The publication carrying ref was definitely refused: reclaim its payload at
        once (the intent resolved as refused, or the counted payload deleted)."""
        if self.payload_store is not None:
            self.payload_store.resolve_intent(ref, msg_id, accepted=False)
            if not self.payload_store.keeps_outbox:
                self.runtime.resolve_publication(msg_id, None)
        else:
            assert self.blob_store is not None
            self.blob_store.delete(ref)

    def accepted(self, ref: str, msg_id: str, stream_seq: int) -> None:
        """The publication carrying ref was accepted at stream_seq: release its intent
        (the readers' obligations keep the payload). A counted payload has no intent:
        its readers count it down."""
        if self.payload_store is not None and self.payload_store.keeps_outbox:
            self.payload_store.resolve_intent(ref, msg_id, accepted=True, stream_seq=stream_seq)
        elif self.payload_store is not None:
            self.payload_store.resolve_intent(ref, msg_id, accepted=True)
            self.runtime.resolve_publication(msg_id, stream_seq)

    # ------------------------------------------------------------------ the reader

    def restore(self, ref: str) -> Any:
        """The message an envelope carries by ref, read on the receiving thread once the
        delivery is the messenger's.

        Raises:
            KeyError: no store is set, or the payload is missing (PayloadMissing).
            WireError: the payload does not decode.
        """
        if self.payload_store is not None:
            # A view, not a copy: from the shared-memory store, arrays in the message
            # are the stored pages themselves.
            view = self.payload_store.view(ref)
            message = decode_message(view, what=f"payload {ref!r}")
            if self.payload_store.shares_bytes:
                self._remember(message, ref, view.nbytes)
            return message
        if self.blob_store is not None:
            return restore_message(ref, self.blob_store)
        raise KeyError(f"payload {ref!r} arrived by ref and no payload store is set")

    def _remember(self, message: Any, ref: str, size: int) -> None:
        values = _frozen_values(message)
        if values is None and not _frozen(message):
            return  # mutable in place: an output that is it may differ from its bytes
        self._forget((ref,))  # a redelivery read again replaces what its first read left
        if len(self._restored) >= _RESTORED_KEPT:  # inputs given up without read_done
            self._forget((self._restored[next(iter(self._restored))][1],))
        self._restored[id(message)] = (message, ref, values, size)
        self._restored_by_ref[ref] = id(message)

    def passed_through(self, message: Any) -> tuple[str, int] | None:
        """The ref and size of the payload message was restored from, when it is that
        input passed on unchanged (the same object; a dict, list or tuple with the same
        values, each immutable or a read-only array); else None."""
        kept = self._restored.get(id(message))
        if kept is None or kept[0] is not message:
            return None
        values = kept[2]
        if values is not None:
            now = _frozen_values(message)
            # By identity, against the values themselves (kept alive here, so a new
            # object cannot take an old one's id).
            if now is None or len(now) != len(values) or not all(
                    a is b for a, b in zip(now, values, strict=True)):
                return None
        return kept[1], kept[3]

    def put_from(self, source: str, msg_id: str,
                 while_waiting: Callable[[], None] | None = None) -> str:
        """put, for an output that is the input restored from source passed on: the
        payload store stores source's bytes again under a new ref without copying them
        where it can (PayloadStore.put_from).

        Raises:
            PayloadMissing: source is gone (never while this node holds it).
        """
        store = self.payload_store
        assert store is not None  # passed_through finds only payload-store inputs
        ttl = {} if self.blob_ttl_seconds is None else {"ttl_seconds": self.blob_ttl_seconds}
        ref = store.put_from(source, self.blob_reader_ids, msg_id, channel=self.node_name,
                             while_waiting=while_waiting, **ttl)
        if not store.keeps_outbox:
            self.runtime.record_publication(msg_id, (ref,), self.blob_reader_ids)
        return ref

    def _forget(self, refs: Sequence[str]) -> None:
        # On every release: by ref, not a scan of everything remembered.
        if self._restored_by_ref:
            for ref in refs:
                key = self._restored_by_ref.pop(ref, None)
                if key is not None:
                    self._restored.pop(key, None)

    def read_done(self, ref: str) -> None:
        """This reader is done with a payload (its settlement confirmed): release its
        obligation, or count one read down in the counter store, deleting the payload
        with the last (BLOB-5)."""
        self._forget((ref,))
        if self.payload_store is not None:
            self.payload_store.release(ref, self.reader_id)
        elif self.blob_store is not None and self.runtime.blob_read(ref) == 0:
            self.blob_store.delete(ref)

    def read_done_many(self, refs: Sequence[str]) -> None:
        """read_done for each of refs, released together where the store can
        (PayloadStore.release_many)."""
        if self.payload_store is not None:
            self._forget(refs)
            self.payload_store.release_many(refs, self.reader_id)
        else:
            for ref in refs:
                self.read_done(ref)

    def pin_for_dead_letter(self, ref: str, parent: str, stream_seq: int) -> bool:
        """Keep a payload for as long as dead letters are kept, before the dead letter of
        the delivery carrying its ref exists.

        The dead letter carries the envelope, and so the ref: its payload must outlive
        the reader's settlement for as long as dead letters are kept (BLOB-14 step 3), or
        a replay would find nothing. Pinned before the dead letter exists, never after.

        Arguments:
            ref: the payload the delivery carried.
            parent / stream_seq: the delivery's identity, naming the pin.

        Returns:
            Whether it was pinned (only the payload store keeps pins); once the dead
            letter's settlement is confirmed, read_done lets this reader's obligation go.
        """
        if self.payload_store is None:
            return False
        pin = f"dlq/{dead_letter_msg_id(self.node_name, parent, stream_seq)}"
        self.payload_store.acquire(ref, pin, ttl_seconds=DLQ_RETENTION_SECONDS)
        return True

    # ------------------------------------------------------------------ the budget

    def budget_waiting(self) -> Callable[[], frozenset[str]] | None:
        """What says which nodes' writers wait for room in their payload share now
        (a store with a budget: shared memory); None for a store without one."""
        waiting: Callable[[], frozenset[str]] | None = getattr(
            self.payload_store, "waiting_nodes", None)
        return waiting

    def budget_shares(self) -> Callable[[], dict[str, dict[str, Any]]] | None:
        """What reads, per node, the bytes its writers hold of a budgeted store against
        their shares, summed over its replicas ({node: {'held_bytes', 'share_bytes',
        'waiting_seconds'}}); None for a store without a budget."""
        states = getattr(self.payload_store, "writer_states", None)
        if states is None:
            return None

        def shares() -> dict[str, dict[str, Any]]:
            nodes: dict[str, dict[str, Any]] = {}
            for state in states():
                node = nodes.setdefault(state.node, {"held_bytes": 0, "share_bytes": 0,
                                                     "waiting_seconds": None})
                node["held_bytes"] += state.held_bytes
                node["share_bytes"] += state.share_bytes or 0
                if state.waiting_seconds is not None:
                    node["waiting_seconds"] = max(node["waiting_seconds"] or 0.0,
                                                  state.waiting_seconds)
            return nodes

        return shares

    def own_share(self) -> dict[str, Any] | None:
        """This replica's writer in a budgeted store: held_bytes, share_bytes,
        waiting_seconds, waited_seconds; None before it wrote there, or for a store
        without a budget."""
        state_of = getattr(self.payload_store, "writer_state", None)
        state = None if state_of is None else state_of()
        if state is None:
            return None
        return {"held_bytes": state.held_bytes, "share_bytes": state.share_bytes,
                "waiting_seconds": state.waiting_seconds,
                "waited_seconds": state.waited_seconds}

    # ------------------------------------------------------------------ reconciliation

    def reconcile(self) -> int:
        """Cancel the payload obligations the ledger shows are no longer owed -- a
        release lost when a reader died after a confirmed ack (PAY-006), an intent whose
        resolution was lost -- judging this node's parents' publications and its own
        from the run ledger's outboxes and the broker's ack floors. At start, then at
        most once per ack_wait; anything it cannot observe stays owed.

        Returns:
            How many obligations were cancelled (0 when it did not run).
        """
        if self.payload_store is None:
            return 0
        now = clock.monotonic()
        if now - self._reconciled_at < self.ack_wait:
            return 0
        self._reconciled_at = now
        channels = [*self.parent_names, self.node_name]
        if self.payload_store.keeps_outbox:
            self.payload_store.reclaim_expired()  # its records die with the host, not a ledger
            ledger: RuntimeObligationLedger = StoreObligationLedger(
                self.payload_store, self.runtime, self.backend, channels)
        else:
            ledger = RuntimeObligationLedger(self.runtime, self.backend, channels)
        return reconcile(self.payload_store, ledger)


_RESTORED_KEPT = 4096
"""The most restored inputs passed_through remembers (those released are forgotten)."""

_IMMUTABLE = (str, bytes, int, float, bool, type(None))


def _frozen(value: Any) -> bool:
    """Whether value cannot change in place: an immutable scalar, or a read-only array
    (one decoded from a store's view cannot be made writeable)."""
    if isinstance(value, np.ndarray):
        return not value.flags.writeable
    return type(value) in _IMMUTABLE


def _frozen_values(message: Any) -> tuple[Any, ...] | None:
    """A dict's keys and values in order, or a list's or tuple's items, when every value
    is _frozen (so the same objects mean the same bytes); None otherwise."""
    if type(message) is dict:
        values = list(message.values())
        flat: tuple[Any, ...] = tuple(x for item in message.items() for x in item)
    elif type(message) in (list, tuple):
        values = list(message)
        flat = tuple(values)
    else:
        return None
    return flat if all(_frozen(value) for value in values) else None


__all__ = ["MessengerPayloads"]
