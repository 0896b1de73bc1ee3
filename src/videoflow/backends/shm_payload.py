"""The shared-memory payload store: frames at memory speed for replicas on one host.

A SharedMemoryPayloadStore is a FilesystemPayloadStore in a memory filesystem
(/dev/shm, else the temporary directory): the producer writes a payload's bytes once,
into a file of its own, and every reader maps that file read-only, so a frame decoded
from ``view`` is a numpy array over the shared pages, never a copy. The obligation rules
are the PayloadStore's (BLOB-14): a put acquires the readers' obligations and the
publisher's intent, readers release by id after a confirmed settlement (PAY-004), the
TTL reclaims what a crash left (BLOB-7), reconciliation cancels releases a crash lost
(PAY-006). Writes are not fsynced: the memory they live in does not outlast the host.

Memory is bounded by a budget shared by every process of the store, cut in shares:
each writer (a replica of a node, ``writer=(node, replica)``) gets an equal share, a
writer declared but yet to put reserves only one payload's room, and a put that would
take its writer over its share, or the store over the budget, waits until readers'
releases make room (backpressure: the publisher stops taking input). So a writer over
its share waits, alone, and no writer can fill the room another needs (the rule, and
why, in videoflow.backends.shm_shares). Past ``budget_wait_seconds`` a put fails with
PayloadBudgetExhausted, naming the budget and the writer's share, rather than dropping
anything. Bytes count once however many refs name them (a pass-through's put_from is a
second name for the file, and costs nothing: its record names the writer the source's
bytes were charged to), and are counted free, against that writer, when their last
name goes. writer_states() and waiting_nodes() tell what each writer holds and who
waits. Payloads above ``offload_above`` (64 KiB) travel by ref through it; the broker
then carries only envelopes.

A reader keeps its mapping while anything holds a view of it, so a payload reclaimed
(or deleted by hand) under a reader's feet stays readable to that reader; one deleted
before it was read is a PayloadMissing, which the messenger dead-letters.

A payload's bytes are written with one gathering call, a frame straight from the
producer's array (put of a GatheredMessage, videoflow.wire.offload): the file then
starts with fewer than PAGE_BYTES zero bytes (its size less the record's), placing
the frame's data at the same offset in its page as in the producer's memory.

A released payload's file of 256 KiB or more is kept as a spare, for the next put to
write over rather than have the memory filesystem allocate and zero new pages, and
only once no process holds it open or mapped (videoflow.backends.shm_spares): 1080p
frames went from 841 MB/s to 1.45 GB/s camera -> pass-through -> sink. Spares count
in the budget.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final, cast

from videoflow.backends.filesystem_payload import FilesystemPayloadStore
from videoflow.backends.payload import (
    BATCH_TTL_SECONDS,
    PINNED_PREFIXES,
    REF_PATTERN,
    PayloadRecord,
)
from videoflow.backends.shm_shares import (
    Fit,
    Freed,
    Writer,
    WriterEntry,
    WriterShares,
    WriterState,
    WriterTable,
    anonymous_writer,
    checked_writer,
    writer_states,
)
from videoflow.backends.shm_spares import SpareFiles
from videoflow.errors import PayloadMissing, UnobservableState, VideoflowError
from videoflow.wire.offload import GatheredMessage

__all__ = [
    "BUDGET_WAIT_SECONDS",
    "DEFAULT_BUDGET_BYTES",
    "OFFLOAD_ABOVE_BYTES",
    "PayloadBudgetExhausted",
    "SharedMemoryPayloadStore",
    "WriterState",
    "shm_root",
    "sweep_expired",
]

DEFAULT_BUDGET_BYTES: Final = 1 << 30
"""How much shared memory a flow's payloads may hold at once (1 GiB): about a second
of eight 1080p cameras at 30 fps, or 3,400 VGA frames."""

OFFLOAD_ABOVE_BYTES: Final = 64 * 1024
"""Payloads larger than this go by ref: past it, a copy through the broker (in, out,
and to its store) costs more than a file write and a mapping."""

BUDGET_WAIT_SECONDS: Final = 60.0
"""How long a put waits for room before it fails: long enough for any reader that is
moving, short enough that a budget too small for the flow (its readers hold more than
it, waiting on outputs that need room) is reported instead of hanging. The local
engine adds its flow's longest join timeout (a leader over its share waits while a join
holds its frames for a lagging parent)."""

PAGE_BYTES: Final = 4096
"""A payload file's padding stays under this (see _write_gathered)."""

_IOV_MAX: Final = 1024  # buffers per pwritev (Linux's IOV_MAX)
_BUDGET: Final = "budget"
_BUDGET_WAIT: Final = "budget_wait"
_OWN: Final = object()  # a new record charged to the store's own writer


class PayloadBudgetExhausted(VideoflowError, RuntimeError):
    """A payload did not fit the shared-memory budget: larger than the budget itself,
    or no room was made within budget_wait_seconds (raise the budget, or the flow's
    readers are not releasing).

    Attributes:
        size / budget / used: the payload's bytes, the budget, the bytes held.
        share / held: the putting writer's share of the budget and the bytes it held
            (None for a payload larger than the budget).
    """

    def __init__(self, message: str, *, size: int, budget: int, used: int,
                 share: int | None = None, held: int | None = None) -> None:
        super().__init__(message)
        self.size, self.budget, self.used = size, budget, used
        self.share, self.held = share, held


def shm_root() -> Path:
    """Where shared-memory stores live: this user's folder under /dev/shm, else under
    the temporary directory (a platform without /dev/shm; memory-backed or not, the
    mapping still spares the broker and the copies)."""
    base = Path("/dev/shm")
    if not (base.is_dir() and os.access(base, os.W_OK)):
        base = Path(tempfile.gettempdir())
    return base / f"videoflow-{os.getuid()}" if hasattr(os, "getuid") else base / "videoflow"


class SharedMemoryPayloadStore(FilesystemPayloadStore):
    """A PayloadStore in shared memory whose reads are zero-copy (see the module).

    Arguments:
        directory: the store's folder, shared by every process that opens it.
        budget_bytes: the bound on the bytes held; None keeps the one the folder was
            made with (DEFAULT_BUDGET_BYTES for a new folder). Given, it is recorded
            for the processes that open the folder after.
        budget_wait_seconds: how long a put waits for room; None keeps the one the
            folder was given (BUDGET_WAIT_SECONDS when none was). Given, it is
            recorded for the processes that open the folder after.
        writer: the (node, replica) this instance writes as, whose share of the
            budget its puts are charged to (videoflow.backends.shm_shares); None: an
            anonymous writer of its own ('', a number unique to the instance).
        **options: PayloadStore's (flow_type, ttl_seconds, clock).

    Attributes:
        budget_waits: puts of this instance that had to wait for room.
        writer: the writer this instance puts as.

    Raises:
        OSError: the folder cannot be created or written.
        ValueError: a budget that is not a positive int, a wait that is not a finite
            number >= 0, a writer that is not a (str, int >= 0) pair.
    """

    durable = False
    offload_above = OFFLOAD_ABOVE_BYTES
    keeps_outbox = True  # the records share the payloads' fate: no remote copy needed

    def __init__(self, directory: str | os.PathLike[str], *, budget_bytes: int | None = None,
                 budget_wait_seconds: float | None = None, writer: Writer | None = None,
                 **options: Any) -> None:
        super().__init__(directory, **options)
        if budget_bytes is not None and (
                isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int)
                or budget_bytes <= 0):
            raise ValueError(f"budget_bytes must be an int > 0, not {budget_bytes!r}")
        if budget_wait_seconds is not None and (
                isinstance(budget_wait_seconds, bool)
                or not isinstance(budget_wait_seconds, (int, float))
                or not math.isfinite(budget_wait_seconds) or budget_wait_seconds < 0):
            raise ValueError("budget_wait_seconds must be a finite number >= 0, not "
                             f"{budget_wait_seconds!r}")
        self.writer: Writer = anonymous_writer() if writer is None else checked_writer(writer)
        budget_file, wait_file = self.directory / _BUDGET, self.directory / _BUDGET_WAIT
        if budget_bytes is not None:
            _write_text(budget_file, str(budget_bytes))
        if budget_wait_seconds is not None:
            _write_text(wait_file, repr(float(budget_wait_seconds)))
        self.budget_bytes = budget_bytes or _read_int(budget_file, DEFAULT_BUDGET_BYTES)
        self.budget_wait_seconds = (float(budget_wait_seconds)
                                    if budget_wait_seconds is not None
                                    else _read_float(wait_file, BUDGET_WAIT_SECONDS))
        self.budget_waits = 0
        self._shares = WriterShares(str(self.directory), self.writer, self._count_bytes)
        self._freeing = threading.local()  # what a release_many has freed
        self._passing = threading.local()  # put_from: the writer its new ref is charged to
        # What each ref whose record this process deleted and whose name it has not
        # dropped yet holds: counted free only if that name turns out the bytes' last.
        self._unnamed: dict[str, Freed] = {}
        self._spares = SpareFiles(str(self.directory / "spares"))

    # --- the budget and its shares (videoflow.backends.shm_shares) -----------------

    def used_bytes(self) -> int:
        """The bytes the store's payloads hold now, by the shared count.

        Returns:
            every writer's bytes, and those a recount found without a writer's record
            (the spares aside).
        """
        with self._locked():
            return self._shares.load().held()

    def declare_writers(self, writers: Iterable[Writer]) -> None:
        """Declare the writers that may put in this folder before any of them starts:
        each is dormant, reserving one payload's floor of the budget instead of a
        share, until its first put (the local engine declares every replica of every
        node that publishes).

        Arguments:
            writers: (node, replica) pairs; one declared already is left as it is.

        Raises:
            ValueError: a writer that is not a (str, int >= 0) pair.
        """
        declared = [checked_writer(writer) for writer in writers]
        with self._locked():
            table = self._shares.load()
            for writer in declared:
                table.declare(writer)
            self._shares.store(table)

    def writer_states(self) -> list[WriterState]:
        """Every writer's standing in the budget, for operators: the bytes it holds
        against its share, whether it waits for room and for how long. Liveness is
        probed now; a dead writer holding nothing leaves the table (or goes dormant,
        when it was declared).

        Returns:
            one WriterState per writer in the table, declared ones included.
        """
        with self._locked():
            table = self._shares.load()
            alive = self._shares.probe(table)
            if table.forget_dead([writer for writer, up in alive.items() if not up]):
                self._shares.store(table)
        return writer_states(table, self.budget_bytes, alive, time.monotonic())

    def writer_state(self) -> WriterState | None:
        """This instance's writer's standing (writer_states).

        Returns:
            its WriterState; None before it is in the table (neither declared nor put).
        """
        return next((state for state in self.writer_states()
                     if (state.node, state.replica) == self.writer), None)

    def waiting_nodes(self) -> frozenset[str]:
        """Which nodes have a writer waiting for room right now: a join does not take
        such a parent for silent (it is held back by the budget, not stopped).

        Returns:
            the nodes' names; writers found dead are left out, and so are anonymous
            ones.
        """
        with self._locked():
            table = self._shares.load()
        waiting = [e for e in table.writers if e.wait_began is not None and e.node]
        alive = self._shares.liveness.probe([e.writer for e in waiting if e.pid])
        return frozenset(e.node for e in waiting if alive.get(e.writer) is not False)

    def _admit(self, size: int, while_waiting: Callable[[], None] | None) -> None:
        if size > self.budget_bytes:
            raise PayloadBudgetExhausted(
                f"a payload of {size} bytes is larger than the shared-memory budget of "
                f"{self.budget_bytes} bytes", size=size, budget=self.budget_bytes, used=0)
        pid = self._shares.attached()
        deadline = time.monotonic() + self.budget_wait_seconds
        delay, waited = 0.001, False
        try:
            while True:
                with self._locked():
                    table = self._shares.load()
                    entry, changed = table.enter(self.writer, pid)
                    fit, spare = self._fit(table, entry, size)
                    if not (fit.within_share and fit.over + spare <= 0) and (
                            self._shares.refresh(table)):
                        changed = True
                        fit, spare = self._fit(table, entry, size)
                    now = time.monotonic()
                    if fit.within_share and fit.over + spare <= 0:
                        table.admitted(entry, size, now)
                        self._shares.store(table)
                        self._shares.flying(size)
                        return
                    if entry.wait_began is None:  # others see it waiting (waiting_nodes)
                        entry.wait_began, changed = now, True
                    if changed:
                        self._shares.store(table)
                if not waited:
                    waited = True
                    self.budget_waits += 1
                if now >= deadline:
                    raise PayloadBudgetExhausted(
                        f"no room for a payload of {size} bytes in the shared-memory budget "
                        f"of {self.budget_bytes} bytes ({table.held() + spare} held) within "
                        f"{self.budget_wait_seconds:g} s: {_named(self.writer)} holds "
                        f"{entry.held} bytes of its share of {fit.share}; raise the budget, "
                        "or find the reader that is not releasing", size=size,
                        budget=self.budget_bytes, used=table.held() + spare,
                        share=fit.share, held=entry.held)
                if while_waiting is not None:
                    while_waiting()
                time.sleep(delay)
                delay = min(2 * delay, 0.05)
        except BaseException:
            if waited:  # failed, or interrupted: waiting no more
                with self._locked():
                    table = self._shares.load()
                    if self._shares.end_wait(table):
                        self._shares.store(table)
            raise

    def _fit(self, table: WriterTable, entry: WriterEntry, size: int) -> tuple[Fit, int]:
        """Where a put of size by entry's writer stands, and the spares' bytes, after
        discarding what spares the put needs (released files kept to be reused hold
        memory too: they go before anyone waits)."""
        fit = table.fit(entry, size, self.budget_bytes)
        spare = sum(self._spares.sizes())
        if fit.within_share and spare and fit.over + spare > 0:
            spare -= self._spares.discard(fit.over + spare)
        return fit, spare

    def _unadmit(self, size: int) -> None:
        since = time.monotonic()  # before the reservation leaves what a recount sees
        self._shares.flying(-size)
        self._count_down([Freed(self.writer, size, since)])

    def _created(self, record: PayloadRecord) -> PayloadRecord:
        # Charged to this instance's writer, or for a pass-through's second name to
        # the writer of the bytes it names (put_from).
        passing = getattr(self._passing, "writer", _OWN)
        charged = self.writer if passing is _OWN else cast("Writer | None", passing)
        # Made, not dataclasses.replace()d: that took 2 us of every put.
        return PayloadRecord(record.obligations, record.readers, record.publication_id,
                             record.expires_at, record.size, record.channel,
                             record.stream_seq, charged)

    def put_from(self, source: str, reader_ids: Sequence[str], publication_id: str, *,
                 ttl_seconds: float | None = None, channel: str | None = None,
                 while_waiting: Callable[[], None] | None = None) -> str:
        """PayloadStore.put_from, the new ref charged to the writer source's bytes are
        charged to: they are freed when their last name goes, whichever that is, and
        counted free against the writer that paid for them.

        Raises:
            PayloadMissing: source is unknown, reclaimed or expired.
            ValueError: as put.
        """
        self._passing.writer = self._live_record(source).writer
        try:
            return super().put_from(source, reader_ids, publication_id,
                                    ttl_seconds=ttl_seconds, channel=channel,
                                    while_waiting=while_waiting)
        finally:
            del self._passing.writer

    def _forgotten(self, ref: str, record: PayloadRecord) -> None:
        # Timed before the record goes: a recount that ends after may not see it.
        self._unnamed[ref] = Freed(record.writer, record.size, time.monotonic())

    def _freed(self, freed: Freed) -> None:
        """The last name of bytes went: count them free."""
        batch = getattr(self._freeing, "batch", None)
        if batch is not None:  # inside release_many: counted down once, at its end
            batch.append(freed)
            return
        self._count_down([freed])

    def _count_down(self, freed: Sequence[Freed]) -> None:
        """Count bytes free against the writers they were charged to, under one
        acquisition of the folder's lock."""
        with self._locked():
            table = self._shares.load()
            table.count_down(freed)
            self._shares.store(table)

    def release_many(self, refs: Sequence[str], obligation_id: str) -> list[bool]:
        """release for each ref, with the shared count of bytes held taken down once
        for all of them (per writer, under one acquisition of the lock). A release
        that frees bytes takes the store-wide lock for the count: a join releasing
        each of a group's frames queued on that lock behind eight cameras' puts, 60%
        of its wall time on a loaded host. A crash before the count goes down leaves
        it high, which the budget's recount corrects."""
        self._freeing.batch = []
        try:
            return [self.release(ref, obligation_id) for ref in refs]
        finally:
            freed, self._freeing.batch = self._freeing.batch, None
            if freed:
                self._count_down(freed)

    def _count_bytes(self) -> dict[Writer | None, int]:
        """The bytes the payload files hold, per writer their records name, by the
        records' sizes, which is what puts charge and releases count free (the
        padding before a gathered frame aside); None for the files without a readable
        record, by their size. A file with several names counts once."""
        found: dict[int, list[Any]] = {}  # inode -> [its bytes, its writer]
        with os.scandir(self._blobs) as entries:
            for entry in entries:
                # Another process renames its temporary file into place, or removes a
                # released payload, between the listing and the stat: gone, it holds
                # nothing.
                with contextlib.suppress(FileNotFoundError):
                    if not entry.is_file():
                        continue
                    # A file with several names (put_from's links) holds its bytes
                    # once; every name's record names the same writer, any will do.
                    known = found.get(entry.inode())
                    if known is None or known[1] is None:
                        record = self._record_of(entry.name)
                        if record is not None:
                            found[entry.inode()] = [record.size, record.writer]
                        elif known is None:
                            found[entry.inode()] = [entry.stat().st_size, None]
        counts: dict[Writer | None, int] = {}
        for size, writer in found.values():
            counts[writer] = counts.get(writer, 0) + size
        return counts

    def _record_of(self, name: str) -> PayloadRecord | None:
        """The record of the payload file name; None for a file that is no payload's
        (a temporary file), or whose record is gone or unreadable."""
        if not REF_PATTERN.match(name):
            return None
        try:
            return self._read_record(name)
        except UnobservableState:
            return None

    # --- writing: once, into a spare where one is free ------------------------------

    writes_gathered = True

    def _write_blob(self, ref: str, data: bytes) -> None:
        self._write_pieces(ref, (data,), len(data), 0)

    def _write_gathered(self, ref: str, data: GatheredMessage) -> None:
        # The largest array's data at the same offset in its page as in the producer's
        # memory: the kernel's copy runs at full speed (a few dozen bytes apart, it
        # was 3-4x slower), and readers get the array aligned as it was.
        pad = 0 if data.address is None else (data.address - data.anchor) % PAGE_BYTES
        self._write_pieces(ref, data.pieces, data.nbytes, pad)

    def _write_pieces(self, ref: str, pieces: Sequence[Any], size: int, pad: int) -> None:
        """Write pad zero bytes, then the pieces, as ref's file: over a spare
        (videoflow.backends.shm_spares) where one is free, else a new file."""
        claimed = self._spares.claim(pad + size)
        path = f"{self._blobs}/{ref}" if claimed is None else claimed
        flags = os.O_WRONLY | (os.O_CREAT | os.O_EXCL if claimed is None else 0)
        try:
            fd = os.open(path, flags, 0o600)
        except BaseException:
            if claimed is not None:
                os.unlink(claimed)
            raise  # a new file that could not be made is no one's to remove
        try:
            try:
                _write_all(fd, [bytes(pad), *pieces] if pad else pieces)
                if claimed is not None:
                    os.ftruncate(fd, pad + size)  # a larger spare's tail
            finally:
                os.close(fd)
            if claimed is not None:
                # Its ref's name only once it holds the bytes: a crash before leaves no
                # short payload, only a claimed spare the next claim removes.
                os.rename(claimed, f"{self._blobs}/{ref}")
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            raise
        self._shares.flying(-size)  # under its ref's name: a recount sees it now

    def _drop_blob(self, ref: str) -> None:
        # Only the drop of the bytes' last name frees them (the others are
        # put_from's links): it alone counts them free, and may keep them as a spare.
        unnamed = self._unnamed.pop(ref, None)
        path = f"{self._blobs}/{ref}"
        try:
            with self._names_locked(ref) as fd:
                if os.fstat(fd).st_nlink > 1:
                    os.unlink(path)  # another ref still names the bytes
                    return
        except FileNotFoundError:
            # Gone before its drop (deleted by hand, or by another process's sweep of
            # names without records, or never written): what it held is unknown, so
            # the count stays until a full budget recounts what is there, at once.
            self._shares.refresh_soon()
            return
        # The last name, and no other can be added now: put_from links only while
        # the source's record is there, and this ref's is deleted.
        if not self._spares.keep(path):
            super()._drop_blob(ref)
        if unnamed is not None:  # not for a name without a record (a crash's leftover)
            self._freed(unnamed)

    # --- reading: zero-copy --------------------------------------------------------

    def view(self, ref: str) -> memoryview:
        """The payload's bytes mapped read-only: arrays decoded from it share the
        store's pages (no copy).

        Raises:
            PayloadMissing: ref unknown, reclaimed, expired, or its bytes are gone.
            UnobservableState: the bytes do not match the record's size.
        """
        record = self._live_record(ref)
        try:
            fd = os.open(f"{self._blobs}/{ref}", os.O_RDONLY)
        except FileNotFoundError:
            raise PayloadMissing(f"payload {ref} has no bytes in {self._blobs} (reclaimed, "
                                 "or deleted from shared memory)", ref=ref) from None
        try:
            size = os.fstat(fd).st_size
            pad = _padding(ref, size, record.size)
            if size == 0:
                return memoryview(b"")
            view = memoryview(mmap.mmap(fd, size, access=mmap.ACCESS_READ))
            return view[pad:] if pad else view
        finally:
            os.close(fd)

    def _payload_of(self, ref: str, data: bytes, size: int) -> bytes:
        pad = _padding(ref, len(data), size)  # get() reads past the padding too
        return data[pad:] if pad else data

    # --- the end of a run ----------------------------------------------------------

    def clear(self) -> int:
        """Reclaim every payload nothing pins (archive/*, dlq/*), and remove the
        folder once it is empty: the end of a run, when no reader is left to owe a
        release. Pinned payloads stay until their TTL.

        Returns:
            How many payloads were reclaimed (0 when the folder is gone already: a
            teardown cleared it).
        """
        if not self.directory.is_dir():
            return 0

        def unpinned(old: PayloadRecord | None) -> tuple[PayloadRecord | None, bool]:
            if old is None or any(o.startswith(PINNED_PREFIXES) for o in old.obligations):
                return old, False
            return None, True

        cleared = 0
        try:
            for ref in self._list_refs():
                if self._mutate(ref, unpinned):
                    cleared += 1
            self.reclaim_expired()
            self._spares.discard()
            if not self._list_refs():
                _remove_with_empty_parent(self.directory)
        except FileNotFoundError:
            # Removed meanwhile: by a teardown's clear, or half made again by another
            # run's sweep_expired that opened the folder (its constructor makes the
            # folders it lacks) as the teardown removed it. Nothing of this run's is
            # in what is left: it goes. (CI met it: records missing under the folder.)
            _remove_with_empty_parent(self.directory)
        return cleared


    def remove_if_empty(self) -> bool:
        """Remove the folder (and its flow's, once no run is left in it) when it holds
        no payload: the end of a run that keeps its streams (failed, stopped, or not
        torn down) but wrote nothing here, whose folder would otherwise stay empty in
        /dev/shm until sweep_expired, a day later. A resume makes it again.

        Returns:
            Whether it was removed (False: a payload is in it, or it is gone already).
        """
        if not self.directory.is_dir() or self._list_refs():
            return False
        self._spares.discard()
        _remove_with_empty_parent(self.directory)
        return True


def sweep_expired(root: Path | None = None) -> int:
    """Reclaim what crashed runs left past its TTL in every store under root (shm_root()
    when None), removing the folders left empty: nothing outlives its TTL even when no
    run of its flow comes back (BLOB-7). A folder goes only when the sweep emptied it,
    or when it has been empty and untouched for BATCH_TTL_SECONDS: an empty folder is
    also a live run's that holds no payload right now, and another run starting on the
    host must not take it away.

    Returns:
        How many payloads were reclaimed.
    """
    root = shm_root() if root is None else root
    reclaimed = 0
    for lock in sorted(root.glob("*/*/.lock")) if root.is_dir() else ():
        folder = lock.parent
        with contextlib.suppress(OSError, UnobservableState):
            # Read before the store is opened: opening and reclaiming touch it.
            idle = time.time() - os.stat(folder / "records").st_mtime
            store = SharedMemoryPayloadStore(folder)
            here = store.reclaim_expired()
            reclaimed += here
            if not store.refs() and (here or idle >= BATCH_TTL_SECONDS):
                _remove_with_empty_parent(folder)
    return reclaimed


def _remove_with_empty_parent(folder: Path) -> None:
    """Remove a run's folder, and its flow's folder once no run is left in it."""
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):  # another run of the flow is still there
        folder.parent.rmdir()


def _padding(ref: str, size: int, recorded: int) -> int:
    """The zero bytes a payload file of size bytes starts with: less than a page, before
    the recorded bytes (SharedMemoryPayloadStore._write_gathered)."""
    pad = size - recorded
    if not 0 <= pad < PAGE_BYTES:
        raise UnobservableState(f"payload {ref} holds {size} bytes, its record says "
                                f"{recorded}", reason="malformed")
    return pad


def _write_all(fd: int, pieces: Sequence[Any]) -> None:
    """Write the pieces one after another from the file's start, with as few calls as
    the kernel allows (one, for a frame and the bytes around it)."""
    views = [memoryview(p).cast("B") for p in pieces if len(p)]
    offset = 0
    while views:
        written = os.pwritev(fd, views[:_IOV_MAX], offset)
        offset += written
        while views and written >= len(views[0]):
            written -= len(views.pop(0))
        if written:
            views[0] = views[0][written:]


def _named(writer: Writer) -> str:
    node, replica = writer
    return f"writer {node}[{replica}]" if node else "this store's writer"


def _read_text(path: str | Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return os.read(fd, 64)
    finally:
        os.close(fd)


def _read_int(path: str | Path, default: int) -> int:
    text = _read_text(path)
    try:
        return int(text or default)
    except ValueError as error:
        raise UnobservableState(f"{path} does not hold a count: {error}",
                                reason="malformed") from error


def _read_float(path: str | Path, default: float) -> float:
    text = _read_text(path)
    try:
        return float(text or default)
    except ValueError as error:
        raise UnobservableState(f"{path} does not hold a number of seconds: {error}",
                                reason="malformed") from error


def _write_text(path: str | Path, text: str) -> None:
    # Written in place: only by a store's constructor, before its processes start.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        data = text.encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
