"""FlowRuntime: a node's ledger (RFC 0006 CTRL-4).

Per node, the records a worker needs to survive its own death and to tell what it
still owes: which parents' end-of-stream markers arrived, the outbox of its
publications, attempt counts per input, the terminal log (DELIV-15), dead-letter
handoffs still owed, open join groups, its checkpoint, its owner epoch (RUN-023)
and, for a replayable producer, the last accepted source offset (MSGID-6).

Every record is one key in a RuntimeStore (videoflow.core.runtime_store), so
each write is a single atomic store write and two processes that race on the same
record meet in a compare-and-swap, never in a lost update. Records of the node as
a whole (outbox, attempts, terminal log, handoffs) are shared by its replicas,
because a redelivery may reach any competing replica; records of one replica's
process (owner epoch, checkpoint, source offset, EOS received sets, open groups)
are kept per replica.

Key layout, tokens escaped by key_token:
``{flow}.{run}.{node}.{outbox|attempt|terminal|handoff}.{id}`` and
``{flow}.{run}.{node}.r{replica}.{owner|checkpoint|offset|eos.{parent}.{r}|group.{id}}``.

This module holds FlowRuntime and its own bookkeeping records; the key escaping and
the records it hands out are in videoflow.core.runtime_records, re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal

import msgspec

from videoflow.core.runtime_records import (
    Checkpoint,
    PendingHandoff,
    Publication,
    PublicationStatus,
    TerminalEntry,
    key_token,
    run_key_filter,
    token_text,
)
from videoflow.core.runtime_store import DEFAULT_BUCKET, MemoryRuntimeStore, RuntimeStore
from videoflow.errors import (
    DurabilityUnavailable,
    LedgerError,
    RevisionConflict,
    SupersededOwner,
)

_CAS_ATTEMPTS: Final = 256
"""How many times a read-modify-write retries a lost compare-and-swap before giving
up with RevisionConflict. Each loss means another writer made progress, so this only
runs out under a pathological number of concurrent writers on one record."""

_ENTERED_KEPT: Final = 4096
"""How many of its own unresolved outbox entries a runtime remembers the revision of
(its window holds at most 1,024 outputs; older ones resolve by a read)."""


class _Owner(msgspec.Struct, frozen=True):
    epoch: int


class _Counter(msgspec.Struct, frozen=True):
    value: int


class _Eos(msgspec.Struct, frozen=True):
    kind: Literal["stop", "abort"]
    epoch: int = 0


class _Group(msgspec.Struct, frozen=True):
    members: dict[str, str]
    epoch: int = 0


_ENCODER: Final = msgspec.msgpack.Encoder()


def _decoder(kind: type[Any]) -> msgspec.msgpack.Decoder[Any]:
    return msgspec.msgpack.Decoder(kind)


_DECODE_OWNER: Final = _decoder(_Owner)
_DECODE_COUNTER: Final = _decoder(_Counter)
_DECODE_PUBLICATION: Final = _decoder(Publication)
_DECODE_CHECKPOINT: Final = _decoder(Checkpoint)
_DECODE_TERMINAL: Final = _decoder(TerminalEntry)
_DECODE_HANDOFF: Final = _decoder(PendingHandoff)
_DECODE_EOS: Final = _decoder(_Eos)
_DECODE_GROUP: Final = _decoder(_Group)


class FlowRuntime:
    """One node replica's view of the run ledger (RFC 0006 CTRL-4).

    Reads need nothing; every write needs this runtime to hold the node replica's
    current owner epoch (claim_owner), and is refused with SupersededOwner once a
    newer owner claimed it (RUN-023). The epoch is checked by reading the owner
    record before each write, so a write racing a newer claim by one round trip can
    still land; the checkpoint is fenced exactly, by the epoch it carries.

    Arguments:
        store: where records live; a MemoryRuntimeStore dies with the process, a
            NatsKvRuntimeStore is durable and shared.
        flow_id: the flow.
        run_id: the run.
        node: this node's name.
        replica_id: this process's replica of the node.
    """

    def __init__(self, store: RuntimeStore, flow_id: str, run_id: str, node: str,
                 replica_id: int = 0) -> None:
        if replica_id < 0:
            raise ValueError(f"replica_id must be >= 0, got {replica_id}")
        self.store = store
        self.flow_id, self.run_id, self.node = flow_id, run_id, node
        self.replica_id = replica_id
        self._epoch: int | None = None
        self._replica_prefix = f"{self._node_prefix(node)}r{replica_id}."
        # Outbox entries this runtime created and has not resolved: (entry, revision).
        self._entered: dict[str, tuple[Publication, int]] = {}

    @classmethod
    def in_memory(cls, flow_id: str, run_id: str, node: str,
                  replica_id: int = 0) -> FlowRuntime:
        """A runtime on a fresh MemoryRuntimeStore, already claimed (epoch 1): the
        messenger's default when it is given no runtime."""
        runtime = cls(MemoryRuntimeStore(), flow_id, run_id, node, replica_id)
        runtime.claim_owner()
        return runtime

    # -- keys -------------------------------------------------------------------

    def _node_prefix(self, node: str) -> str:
        return f"{key_token(self.flow_id)}.{key_token(self.run_id)}.{key_token(node)}."

    def _node_key(self, kind: str, ident: str) -> str:
        return f"{self._node_prefix(self.node)}{kind}.{key_token(ident)}"

    def _replica_key(self, *parts: str) -> str:
        return self._replica_prefix + ".".join(parts)

    # -- ownership ----------------------------------------------------------------

    def durable_shared(self) -> bool:
        """Whether this ledger outlives the process and is visible to other
        processes (a NATS KV store) — False for a memory store, whose records die
        with this process; durability-promising calls then refuse (RUN-022)."""
        return self.store.durable_shared()

    @property
    def epoch(self) -> int | None:
        """The owner epoch this runtime claimed, or None before claim_owner."""
        return self._epoch

    def claim_owner(self) -> int:
        """Become the node replica's owner: increment its epoch by compare-and-swap,
        which supersedes every earlier owner (RUN-023). Live message ids are minted
        under it (MSGID-5: ``{node}:{epoch}:{n}``).

        Returns:
            the new epoch (1 for the first owner ever).

        Raises:
            RevisionConflict: the CAS lost _CAS_ATTEMPTS times in a row.
            BrokerUnavailable: the store could not be reached.
        """
        key = self._replica_key("owner")

        def bump(current: _Owner | None) -> _Owner:
            return _Owner(epoch=1 if current is None else current.epoch + 1)

        self._epoch = self._read_modify_write(key, _DECODE_OWNER, bump, fenced=False).epoch
        return self._epoch

    def current_epoch(self) -> int | None:
        """The newest owner epoch in the ledger (None when none was ever claimed)."""
        found = self.store.get(self._replica_key("owner"))
        return None if found is None else _DECODE_OWNER.decode(found[0]).epoch

    def _fence(self) -> int:
        """Check this runtime still owns the node replica; return its epoch.

        Raises:
            LedgerError: claim_owner was never called.
            SupersededOwner: a newer owner claimed (RUN-023).
        """
        if self._epoch is None:
            raise LedgerError(
                f"ledger of {self.node!r} replica {self.replica_id}: "
                "claim_owner() before writing"
            )
        current = self.current_epoch()
        if current != self._epoch:
            raise SupersededOwner(
                f"{self.node!r} replica {self.replica_id}: epoch {self._epoch} was "
                f"superseded by epoch {current} (RUN-023)",
                epoch=self._epoch, current_epoch=current,
            )
        return self._epoch

    def _read_modify_write(self, key: str, decoder: msgspec.msgpack.Decoder[Any] | None,
                           change: Callable[[Any], Any], *, fenced: bool = True) -> Any:
        """Apply change to the record under key by compare-and-swap, retrying a lost
        race on a fresh read; change(None) builds an absent record, and a None
        decoder means change ignores the current record. Returns what was written."""
        for _ in range(_CAS_ATTEMPTS):
            if fenced:
                self._fence()
            found = self.store.get(key)
            current = None if found is None or decoder is None else decoder.decode(found[0])
            record = change(current)
            try:
                if found is None:
                    self.store.create(key, _ENCODER.encode(record))
                else:
                    self.store.update(key, _ENCODER.encode(record), found[1])
                return record
            except RevisionConflict:
                continue
        raise RevisionConflict(
            f"ledger key {key!r}: lost {_CAS_ATTEMPTS} compare-and-swaps in a row", key=key
        )

    def _put(self, key: str, record: Any) -> None:
        """Write record under key whatever it held (fenced)."""
        self._read_modify_write(key, None, lambda _current: record)

    def _delete(self, key: str) -> None:
        self._fence()
        self.store.delete(key)

    def _list(self, prefix: str, decoder: msgspec.msgpack.Decoder[Any]) -> list[Any]:
        records = []
        for key in self.store.keys(prefix):
            found = self.store.get(key)
            if found is not None:  # deleted between listing and reading
                records.append(decoder.decode(found[0]))
        return records

    # -- outbox -------------------------------------------------------------------

    def record_publication(self, publication_id: str, payload_refs: Sequence[str] = (),
                           obligations: Sequence[str] = ()) -> Publication:
        """Enter a publication in the outbox as unresolved, before it is sent: from
        here until resolve_publication its intent is owed (PAY-007), and a crash in
        between leaves a record reconciliation can judge.

        Arguments:
            publication_id: the broker dedup id (MSGID-5/6).
            payload_refs: payload store refs the publication carries.
            obligations: the reader obligation ids the payload put acquired.

        Returns:
            the outbox entry; an existing entry of that id is kept and returned
            unchanged (a retried send records nothing new).

        Raises:
            SupersededOwner, LedgerError: see _fence.
            BrokerUnavailable: the store could not be reached.
        """
        key = self._node_key("outbox", publication_id)
        epoch = self._fence()
        entry = Publication(publication_id, tuple(payload_refs), tuple(obligations), epoch=epoch)
        try:
            # A new id is the rule, so create it outright: one round trip, not a read
            # that finds nothing and then a create.
            revision = self.store.create(key, _ENCODER.encode(entry))
        except RevisionConflict:
            found = self.store.get(key)
            if found is not None:  # a retried send: the first entry stands
                return _DECODE_PUBLICATION.decode(found[0])
            # Deleted between the create and the read: enter it as any absent record.
            record: Publication = self._read_modify_write(
                key, _DECODE_PUBLICATION, lambda current: current or entry, fenced=False)
            return record
        self._entered[publication_id] = (entry, revision)
        while len(self._entered) > _ENTERED_KEPT:  # unresolved ones (unknown outcomes)
            del self._entered[next(iter(self._entered))]
        return entry

    def resolve_publication(self, publication_id: str, stream_seq: int | None) -> Publication:
        """Record a publication's definite outcome: accepted at stream_seq, or
        refused (stream_seq None; definitely not stored, so nothing is owed for it:
        PAY-013). An unknown outcome is not a resolution: leave it unresolved.

        Returns:
            the updated entry. Resolving again to the same outcome is a no-op.

        Raises:
            KeyError: no such publication in this node's outbox.
            LedgerError: it was already resolved to a different outcome.
            SupersededOwner: see _fence.
            BrokerUnavailable: the store could not be reached.
        """
        key = self._node_key("outbox", publication_id)
        status: PublicationStatus = "refused" if stream_seq is None else "accepted"
        entered = self._entered.pop(publication_id, None)
        if entered is not None:
            # This runtime entered it: update the revision it wrote, with no read. A
            # lost race (someone else wrote it since) takes the general path below.
            entry, revision = entered
            self._fence()
            resolved = msgspec.structs.replace(entry, status=status, stream_seq=stream_seq)
            try:
                self.store.update(key, _ENCODER.encode(resolved), revision)
                return resolved
            except RevisionConflict:
                pass

        def resolve(current: Publication | None) -> Publication:
            if current is None:
                raise KeyError(f"no publication {publication_id!r} in {self.node!r}'s outbox")
            if current.status != "unresolved" and (
                current.status, current.stream_seq) != (status, stream_seq):
                raise LedgerError(
                    f"publication {publication_id!r} is already {current.status} "
                    f"(stream_seq {current.stream_seq}); cannot make it {status}"
                )
            return msgspec.structs.replace(current, status=status, stream_seq=stream_seq)

        record: Publication = self._read_modify_write(key, _DECODE_PUBLICATION, resolve)
        return record

    def forget_publication(self, publication_id: str) -> None:
        """Drop a publication from the outbox once nothing is owed for it (every
        obligation released or cancelled). Absent ids are fine."""
        self._delete(self._node_key("outbox", publication_id))

    def publication(self, publication_id: str, node: str | None = None) -> Publication | None:
        """One outbox entry of node (default: this node), or None."""
        prefix = self._node_prefix(self.node if node is None else node)
        found = self.store.get(f"{prefix}outbox.{key_token(publication_id)}")
        return None if found is None else _DECODE_PUBLICATION.decode(found[0])

    def outbox(self, node: str | None = None) -> list[Publication]:
        """Every outbox entry of node in this run (default: this node), in key order.
        A child's obligation ledger reads its parents' outboxes with node=parent."""
        prefix = self._node_prefix(self.node if node is None else node)
        return self._list(f"{prefix}outbox.", _DECODE_PUBLICATION)

    # -- attempts -----------------------------------------------------------------

    def count_attempt(self, key: str) -> int:
        """Count one more processing attempt of an input message (its identity, as
        the delivery policy's retry budget sees it). Shared by the node's replicas,
        since a redelivery may reach any of them; concurrent counts never lose an
        increment (compare-and-swap).

        Returns:
            the attempt count including this one (1 for the first).

        Raises:
            SupersededOwner, LedgerError: see _fence.
            RevisionConflict: lost the CAS _CAS_ATTEMPTS times in a row.
            BrokerUnavailable: the store could not be reached.
        """
        def increment(current: _Counter | None) -> _Counter:
            return _Counter(1 if current is None else current.value + 1)

        record: _Counter = self._read_modify_write(
            self._node_key("attempt", key), _DECODE_COUNTER, increment
        )
        return record.value

    def attempts(self, key: str) -> int:
        """How many attempts of the input message were counted (0 when none)."""
        found = self.store.get(self._node_key("attempt", key))
        return 0 if found is None else _DECODE_COUNTER.decode(found[0]).value

    def clear_attempts(self, key: str) -> None:
        """Forget an input's attempt count once its delivery is settled for good."""
        self._delete(self._node_key("attempt", key))

    # -- blob reader counts (BLOB-5) ----------------------------------------------

    def _blob_key(self, ref: str) -> str:
        # Run-scoped, not node-scoped: the publisher sets it, its readers count down.
        return f"{key_token(self.flow_id)}.{key_token(self.run_id)}._blob.{key_token(ref)}"

    def count_blob_readers(self, ref: str, readers: int) -> None:
        """Record that a payload in the counter BlobStore is owed ``readers`` reads
        (BLOB-5); set once, by its publisher, before the envelope naming it is sent.

        Raises:
            ValueError: readers below 1.
        """
        if readers < 1:
            raise ValueError(f"readers must be >= 1, got {readers}")
        self._read_modify_write(self._blob_key(ref), _DECODE_COUNTER,
                                lambda current: current or _Counter(value=readers))

    def blob_read(self, ref: str) -> int | None:
        """One reader is done with ref (its settlement confirmed): count it down.

        Returns:
            the reads still owed -- 0 means the payload may be deleted now, and the
            count is gone -- or None when ref has no count (its publisher set none:
            the payload is TTL-only).
        """
        key = self._blob_key(ref)
        for _ in range(_CAS_ATTEMPTS):
            self._fence()
            found = self.store.get(key)
            if found is None:
                return None
            remaining = _DECODE_COUNTER.decode(found[0]).value - 1
            try:
                if remaining <= 0:
                    self.store.delete(key)
                    return 0
                self.store.update(key, _ENCODER.encode(_Counter(value=remaining)), found[1])
                return remaining
            except RevisionConflict:
                continue
        raise RevisionConflict(
            f"ledger key {key!r}: lost {_CAS_ATTEMPTS} compare-and-swaps in a row", key=key)

    # -- terminal log and dead-letter handoffs --------------------------------------

    def log_terminal(self, key: str, record_ref: str, reason: str) -> TerminalEntry:
        """Enter a delivery the node ended without a dead letter in the terminal log:
        the durable record its termination points at (DELIV-15). Write this before
        terminating the delivery.

        Returns:
            the entry; the first entry for key is kept (a re-terminated redelivery
            points at the same record).

        Raises:
            SupersededOwner, LedgerError: see _fence.
            BrokerUnavailable: the store could not be reached.
        """
        return self.log_terminals([(key, record_ref, reason)])[0]

    def log_terminals(self, entries: Sequence[tuple[str, str, str]]) -> list[TerminalEntry]:
        """log_terminal for each (key, record_ref, reason), fenced once and written as
        one batch (RuntimeStore.create_many): a join evicting a burst of inputs paid
        four store round trips each, which under load put it further behind, and so
        made it evict more.

        Returns:
            per entry, in order, the entry the log holds for its key (the first kept).

        Raises:
            SupersededOwner, LedgerError: see _fence; nothing was written.
            BrokerUnavailable: the store could not be reached; some entries may have
                been written (writing one again keeps the first).
        """
        if not entries:
            return []
        epoch = self._fence()
        records = [TerminalEntry(key, ref, reason, epoch) for key, ref, reason in entries]
        keys = [self._node_key("terminal", key) for key, _, _ in entries]
        made = self.store.create_many(
            [(k, _ENCODER.encode(r)) for k, r in zip(keys, records, strict=True)])
        kept: list[TerminalEntry] = []
        for key, record, revision in zip(keys, records, made, strict=True):
            if revision is None:  # logged before: the first entry stands
                record = self._read_modify_write(key, _DECODE_TERMINAL, _first(record))
            kept.append(record)
        return kept

    def terminal_entries(self) -> list[TerminalEntry]:
        """The node's terminal log, every replica's entries, in key order."""
        return self._list(f"{self._node_prefix(self.node)}terminal.", _DECODE_TERMINAL)

    def add_pending_handoff(self, key: str, parent: str, reason: str) -> None:
        """Record that an input's retry budget is exhausted but its dead letter could
        not be written yet, so the broker keeps it and it is unresolved work
        (DELIV-15, MSG-012). Re-adding replaces the reason."""
        epoch = self._fence()
        self._put(self._node_key("handoff", key), PendingHandoff(key, parent, reason, epoch))

    def clear_pending_handoff(self, key: str) -> None:
        """The handoff is done (the settlement that terminated the input was
        confirmed) or moot (the message left the stream). Absent keys are fine."""
        self._delete(self._node_key("handoff", key))

    def pending_handoffs(self, parent: str | None = None) -> list[PendingHandoff]:
        """Pending dead-letter handoffs of the node, those from parent only if given."""
        found = self._list(f"{self._node_prefix(self.node)}handoff.", _DECODE_HANDOFF)
        return [h for h in found if parent is None or h.parent == parent]

    # -- end of stream ------------------------------------------------------------

    def record_eos(self, parent: str, parent_replica: int, *, aborted: bool = False) -> bool:
        """Record that parent's replica parent_replica ended its stream (a clean
        end-of-stream marker, or an abort when aborted). The first marker of a
        replica is kept: an abort never turns into a clean stop or back.

        Returns:
            True when this marker was new, False for a duplicate.

        Raises:
            SupersededOwner, LedgerError: see _fence.
            BrokerUnavailable: the store could not be reached.
        """
        key = self._replica_key("eos", key_token(parent), str(int(parent_replica)))
        epoch = self._fence()
        try:
            self.store.create(key, _ENCODER.encode(
                _Eos("abort" if aborted else "stop", epoch)
            ))
        except RevisionConflict:
            return False
        return True

    def eos_received(self, parent: str) -> dict[int, Literal["stop", "abort"]]:
        """Which of parent's replicas ended their stream, and how: {replica: 'stop'
        | 'abort'}. A parent is terminated when every one of its replicas is in it."""
        prefix = self._replica_key("eos", key_token(parent)) + "."
        received: dict[int, Literal["stop", "abort"]] = {}
        for key in self.store.keys(prefix):
            found = self.store.get(key)
            if found is not None:
                received[int(key[len(prefix):])] = _DECODE_EOS.decode(found[0]).kind
        return received

    # -- open groups --------------------------------------------------------------

    def open_group(self, group_key: str, members: Mapping[str, str]) -> None:
        """Record a join group this replica holds open, and its members so far
        ({parent: input message identity}); re-opening replaces the members."""
        epoch = self._fence()
        self._put(self._replica_key("group", key_token(group_key)),
                  _Group(dict(members), epoch))

    def close_group(self, group_key: str) -> None:
        """The group was emitted, evicted or handed back. Absent keys are fine."""
        self._delete(self._replica_key("group", key_token(group_key)))

    def open_groups(self) -> dict[str, dict[str, str]]:
        """This replica's open groups: {group_key: {parent: message identity}}."""
        prefix = self._replica_key("group") + "."
        groups: dict[str, dict[str, str]] = {}
        for key in self.store.keys(prefix):
            found = self.store.get(key)
            if found is not None:
                groups[token_text(key[len(prefix):])] = _DECODE_GROUP.decode(found[0]).members
        return groups

    # -- checkpoint ---------------------------------------------------------------

    def checkpoint(self, state: bytes, covered_group: str, output: str | None = None) -> None:
        """Commit the node replica's state together with the input group it covers,
        and the output publication committed with it if any, in ONE store write
        (RUN-022): a replacement restores state and the inputs it must still see as
        the same committed prefix. Compare-and-swap on the checkpoint record, which
        carries its writer's epoch, so no older owner can ever overwrite a newer
        owner's checkpoint.

        Arguments:
            state: the node's state.
            covered_group: the input group identity (last_input_key) included.
            output: the publication id of the output committed with it, if any.

        Raises:
            DurabilityUnavailable: the store dies with the process (memory): refused
                rather than faked (RUN-022).
            SupersededOwner: a newer owner claimed, or already checkpointed (RUN-023).
            LedgerError: claim_owner was never called.
            BrokerUnavailable: the store could not be reached.
        """
        if not self.durable_shared():
            raise DurabilityUnavailable(
                f"{self.node!r} replica {self.replica_id}: the runtime ledger is in "
                "memory and dies with this process, so a checkpoint would not be "
                "durable; configure a NATS KV runtime store (RUN-022)"
            )
        epoch = self._fence()

        def commit(current: Checkpoint | None) -> Checkpoint:
            if current is not None and current.epoch > epoch:
                raise SupersededOwner(
                    f"{self.node!r} replica {self.replica_id}: epoch {epoch} cannot "
                    f"overwrite epoch {current.epoch}'s checkpoint (RUN-023)",
                    epoch=epoch, current_epoch=current.epoch,
                )
            return Checkpoint(bytes(state), covered_group, output, epoch)

        self._read_modify_write(self._replica_key("checkpoint"), _DECODE_CHECKPOINT, commit)

    def restore_checkpoint(self) -> Checkpoint | None:
        """The last committed checkpoint of this node replica (state, covered_group,
        output, epoch), or None when there is none."""
        found = self.store.get(self._replica_key("checkpoint"))
        return None if found is None else _DECODE_CHECKPOINT.decode(found[0])

    # -- source offset ------------------------------------------------------------

    def set_source_offset(self, offset: int) -> int:
        """Record that a replayable producer's publication from source offset was
        accepted (MSGID-6). The record only moves forward, so acceptances confirmed
        out of order never move it back.

        Returns:
            the recorded offset after this call (the larger of it and offset).

        Raises:
            ValueError: offset < 0.
            SupersededOwner, LedgerError: see _fence.
            BrokerUnavailable: the store could not be reached.
        """
        if offset < 0:
            raise ValueError(f"a source offset is >= 0, got {offset}")

        def advance(current: _Counter | None) -> _Counter:
            return _Counter(offset if current is None else max(current.value, offset))

        record: _Counter = self._read_modify_write(
            self._replica_key("offset"), _DECODE_COUNTER, advance
        )
        return record.value

    def source_offset(self) -> int:
        """The last accepted source offset (0 when none was recorded): a replayable
        producer resumes from the next one (resume_offset)."""
        found = self.store.get(self._replica_key("offset"))
        return 0 if found is None else _DECODE_COUNTER.decode(found[0]).value


def forget_aborts(store: RuntimeStore, flow_id: str, run_id: str) -> int:
    """For a run about to be resumed, before any of its replicas starts: forget every
    abort its replicas recorded from a parent's replica. record_eos keeps a replica's
    first marker for good, so a child would otherwise abort again on the resume, as
    its parent did before it, although the parent is started again and ends its stream
    anew. A clean end stays: that replica is not started again.

    Returns:
        how many were forgotten.
    """
    prefix = f"{key_token(flow_id)}.{key_token(run_id)}."
    forgotten = 0
    for key in store.keys(prefix):
        # {node}.r{replica}.eos.{parent}.{parent replica}
        parts = key[len(prefix):].split(".")
        if len(parts) != 5 or parts[2] != "eos":
            continue
        found = store.get(key)
        if found is not None and _DECODE_EOS.decode(found[0]).kind == "abort":
            store.delete(key)
            forgotten += 1
    return forgotten


def _first(entry: TerminalEntry) -> Callable[[TerminalEntry | None], TerminalEntry]:
    """A change that keeps the entry a key already holds, else writes entry."""
    return lambda current: current or entry


__all__ = [
    "DEFAULT_BUCKET",
    "Checkpoint",
    "FlowRuntime",
    "MemoryRuntimeStore",
    "PendingHandoff",
    "Publication",
    "RuntimeStore",
    "TerminalEntry",
    "forget_aborts",
    "key_token",
    "run_key_filter",
    "token_text",
]
