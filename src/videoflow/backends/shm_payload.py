"""The shared-memory payload store: frames at memory speed for replicas on one host.

A SharedMemoryPayloadStore is a FilesystemPayloadStore in a memory filesystem
(/dev/shm, else the temporary directory): the producer writes a payload's bytes once,
into a file of its own, and every reader maps that file read-only, so a frame decoded
from ``view`` is a numpy array over the shared pages, never a copy. The obligation rules
are the PayloadStore's (BLOB-14): a put acquires the readers' obligations and the
publisher's intent, readers release by id after a confirmed settlement (PAY-004), the
TTL reclaims what a crash left (BLOB-7), reconciliation cancels releases a crash lost
(PAY-006). Writes are not fsynced: the memory they live in does not outlast the host.

Memory is bounded by a budget shared by every process of the store. A put that does not
fit waits until readers' releases make room (backpressure: the publisher stops taking
input), and past ``budget_wait_seconds`` fails with PayloadBudgetExhausted, naming the
budget, rather than dropping anything. Bytes count once however many refs name them (a
pass-through's put_from is a second name for the file, and costs nothing), and are
counted free when their last name goes. Payloads above ``offload_above`` (64 KiB) travel
by ref through it; the broker then carries only envelopes.

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
import mmap
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from videoflow.backends.filesystem_payload import FilesystemPayloadStore
from videoflow.backends.payload import BATCH_TTL_SECONDS, PINNED_PREFIXES, PayloadRecord
from videoflow.backends.shm_spares import SpareFiles
from videoflow.errors import PayloadMissing, UnobservableState, VideoflowError
from videoflow.wire.offload import GatheredMessage

__all__ = [
    "DEFAULT_BUDGET_BYTES",
    "OFFLOAD_ABOVE_BYTES",
    "PayloadBudgetExhausted",
    "SharedMemoryPayloadStore",
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
it, waiting on outputs that need room) is reported instead of hanging."""

PAGE_BYTES: Final = 4096
"""A payload file's padding stays under this (see _write_gathered)."""

_IOV_MAX: Final = 1024  # buffers per pwritev (Linux's IOV_MAX)
_RECOUNT_SECONDS: Final = 0.5
_USAGE: Final = "usage"
_BUDGET: Final = "budget"


class PayloadBudgetExhausted(VideoflowError, RuntimeError):
    """A payload did not fit the shared-memory budget: larger than the budget itself,
    or no room was made within budget_wait_seconds (raise the budget, or the flow's
    readers are not releasing).

    Attributes:
        size / budget / used: the payload's bytes, the budget, the bytes held.
    """

    def __init__(self, message: str, *, size: int, budget: int, used: int) -> None:
        super().__init__(message)
        self.size, self.budget, self.used = size, budget, used


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
        budget_wait_seconds: how long a put waits for room.
        **options: PayloadStore's (flow_type, ttl_seconds, clock).

    Attributes:
        budget_waits: puts of this instance that had to wait for room.

    Raises:
        OSError: the folder cannot be created or written.
        ValueError: a budget that is not a positive int.
    """

    durable = False
    offload_above = OFFLOAD_ABOVE_BYTES
    keeps_outbox = True  # the records share the payloads' fate: no remote copy needed

    def __init__(self, directory: str | os.PathLike[str], *, budget_bytes: int | None = None,
                 budget_wait_seconds: float = BUDGET_WAIT_SECONDS, **options: Any) -> None:
        super().__init__(directory, **options)
        if budget_bytes is not None and (
                isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int)
                or budget_bytes <= 0):
            raise ValueError(f"budget_bytes must be an int > 0, not {budget_bytes!r}")
        budget_file = self.directory / _BUDGET
        if budget_bytes is not None:
            _write_int(budget_file, budget_bytes)
        self.budget_bytes = budget_bytes or _read_int(budget_file, DEFAULT_BUDGET_BYTES)
        self.budget_wait_seconds = budget_wait_seconds
        self.budget_waits = 0
        self._usage_path = str(self.directory / _USAGE)
        self._recounted_at = -_RECOUNT_SECONDS
        self._freeing = threading.local()  # bytes a release_many has freed so far
        # The size of each ref whose record this process deleted and whose name it has
        # not dropped yet: counted free only if that name turns out the bytes' last.
        self._unnamed: dict[str, int] = {}
        self._spares = SpareFiles(str(self.directory / "spares"))

    # --- the budget ----------------------------------------------------------------

    def used_bytes(self) -> int:
        """The bytes the store's payloads hold now, by the shared count."""
        with self._locked():
            return _read_int(self._usage_path, 0)

    def _admit(self, size: int, while_waiting: Callable[[], None] | None) -> None:
        if size > self.budget_bytes:
            raise PayloadBudgetExhausted(
                f"a payload of {size} bytes is larger than the shared-memory budget of "
                f"{self.budget_bytes} bytes", size=size, budget=self.budget_bytes, used=0)
        deadline = time.monotonic() + self.budget_wait_seconds
        delay, waited = 0.001, False
        while True:
            with self._locked():
                used = _read_int(self._usage_path, 0)
                # Released files kept to be reused hold memory too: they go first.
                spare = sum(self._spares.sizes())
                if used + spare + size > self.budget_bytes:
                    spare -= self._spares.discard(used + spare + size - self.budget_bytes)
                if used + spare + size > self.budget_bytes and (
                        time.monotonic() - self._recounted_at >= _RECOUNT_SECONDS):
                    # The count drifts only upward (a crash between a reservation and
                    # its record, bytes deleted by hand); what is mapped is the truth.
                    # Once per _RECOUNT_SECONDS per process, not per put: with the
                    # budget full, a listing per frame was a tenth of a camera's time.
                    used, self._recounted_at = self._count_bytes(), time.monotonic()
                if used + spare + size <= self.budget_bytes:
                    _write_int(self._usage_path, used + size)
                    return
            if not waited:
                waited = True
                self.budget_waits += 1
            if time.monotonic() >= deadline:
                raise PayloadBudgetExhausted(
                    f"no room for a payload of {size} bytes in the shared-memory budget of "
                    f"{self.budget_bytes} bytes ({used + spare} held) within "
                    f"{self.budget_wait_seconds:g} s: raise the budget, or find the reader "
                    "that is not releasing", size=size, budget=self.budget_bytes,
                    used=used + spare)
            if while_waiting is not None:
                while_waiting()
            time.sleep(delay)
            delay = min(2 * delay, 0.05)

    def _unadmit(self, size: int) -> None:
        self._count_down(size)

    def _forgotten(self, ref: str, record: PayloadRecord) -> None:
        self._unnamed[ref] = record.size

    def _freed(self, size: int) -> None:
        """The last name of bytes of size went: count them free."""
        freed = getattr(self._freeing, "bytes", None)
        if freed is not None:  # inside release_many: counted down once, at its end
            self._freeing.bytes = freed + size
            return
        self._count_down(size)

    def _count_down(self, size: int) -> None:
        with self._locked():
            used = _read_int(self._usage_path, 0)
            _write_int(self._usage_path, max(0, used - size))

    def release_many(self, refs: Sequence[str], obligation_id: str) -> list[bool]:
        """release for each ref, with the shared count of bytes held taken down once
        for all of them. A release that frees bytes takes the store-wide lock for the
        count: a join releasing each of a group's frames queued on that lock behind
        eight cameras' puts, 60% of its wall time on a loaded host. A crash before the
        count goes down leaves it high, which the budget's recount corrects."""
        self._freeing.bytes = 0
        try:
            return [self.release(ref, obligation_id) for ref in refs]
        finally:
            freed, self._freeing.bytes = self._freeing.bytes, None
            if freed:
                self._count_down(freed)

    def _count_bytes(self) -> int:
        total, seen = 0, set()
        with os.scandir(self._blobs) as entries:
            for entry in entries:
                # Another process renames its temporary file into place, or removes a
                # released payload, between the listing and the stat: gone, it holds
                # nothing.
                with contextlib.suppress(FileNotFoundError):
                    # A file with several names (put_from's links) holds its bytes once.
                    if entry.is_file() and entry.inode() not in seen:
                        seen.add(entry.inode())
                        total += entry.stat().st_size
        return total

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

    def _drop_blob(self, ref: str) -> None:
        # Only the drop of the bytes' last name frees them (the others are
        # put_from's links): it alone counts them free, and may keep them as a spare.
        size = self._unnamed.pop(ref, None)
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
            self._recounted_at = -_RECOUNT_SECONDS
            return
        # The last name, and no other can be added now: put_from links only while
        # the source's record is there, and this ref's is deleted.
        if not self._spares.keep(path):
            super()._drop_blob(ref)
        if size is not None:  # not for a name without a record (a crash's leftover)
            self._freed(size)

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
            How many payloads were reclaimed.
        """
        def unpinned(old: PayloadRecord | None) -> tuple[PayloadRecord | None, bool]:
            if old is None or any(o.startswith(PINNED_PREFIXES) for o in old.obligations):
                return old, False
            return None, True

        cleared = sum(1 for ref in self._list_refs() if self._mutate(ref, unpinned))
        self.reclaim_expired()
        self._spares.discard()
        if not self._list_refs():
            _remove_with_empty_parent(self.directory)
        return cleared


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


def _read_int(path: str | Path, default: int) -> int:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return default
    try:
        text = os.read(fd, 64)
    finally:
        os.close(fd)
    try:
        return int(text or default)
    except ValueError as error:
        raise UnobservableState(f"{path} does not hold a count: {error}",
                                reason="malformed") from error


def _write_int(path: str | Path, value: int) -> None:
    # Written in place under the store's lock, which every reader of the count holds.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        data = str(value).encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
