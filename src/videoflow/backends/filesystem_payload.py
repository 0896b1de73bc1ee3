"""The filesystem payload store: a directory that keeps a flow's payloads and their
obligation records across a restart.

A FilesystemPayloadStore is a PayloadStore (videoflow.backends.payload) whose records
sit beside the blobs in one directory, written whole and under a flock, so processes
on one host can share it; the shared-memory store (videoflow.backends.shm_payload)
is one in a memory filesystem.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, TypeVar

from videoflow.backends.payload import (
    REF_PATTERN,
    Change,
    PayloadRecord,
    PayloadStore,
    apply_change,
)
from videoflow.errors import PayloadMissing

__all__ = ["FilesystemPayloadStore"]

T = TypeVar("T")


class FilesystemPayloadStore(PayloadStore):
    """A PayloadStore in a directory: ``blobs/<ref>`` beside ``records/<ref>.json``.

    Every record is written whole (a temporary file, fsync, os.replace), so a reader or
    a restarted process sees the old version or the new one, never half of one. A
    payload's bytes are written once, straight under their new ref, after its record
    and before any publication names the ref: bytes a crash cut short are never read
    as a payload (their size disagrees with the record, which the TTL reclaims).
    Record changes hold an exclusive flock on ``.lock``, so processes sharing the
    directory (on one host) never lose a release.

    Arguments:
        directory: created when missing.
        **options: PayloadStore's (flow_type, ttl_seconds, clock).

    Raises:
        OSError: the directory cannot be created or written.
    """

    def __init__(self, directory: str | os.PathLike[str], **options: Any) -> None:
        super().__init__(**options)
        self.directory = Path(directory)
        # Plain strings: pathlib's joins cost more than the syscalls they name.
        self._blobs = str(self.directory / "blobs")
        self._records = str(self.directory / "records")
        os.makedirs(self._blobs, exist_ok=True)
        os.makedirs(self._records, exist_ok=True)
        self._lock_path = str(self.directory / ".lock")
        # One lock per 16th of the refs (by their first hex digit) for record changes,
        # and the folder's .lock for what spans refs: writers of different refs do
        # not queue behind each other.
        self._thread_locks = {stripe: threading.Lock() for stripe in "0123456789abcdef"}
        self._thread_locks[""] = threading.Lock()

    durable: bool = True
    """Whether writes are fsynced: a store in memory (tmpfs) has no disk to reach."""
    shares_bytes = True  # put_from links the file: each ref's name, the same bytes

    def _created(self, record: PayloadRecord) -> PayloadRecord:
        """A new ref's first record, as it is about to be written (a put's): the
        shared-memory store names in it the writer the bytes are charged to."""
        return record

    def _forgotten(self, ref: str, record: PayloadRecord) -> None:
        """ref's record is about to be deleted (under its lock), its name to be dropped
        after: a budgeted store notes what the bytes hold, to free it with their last
        name."""

    @contextlib.contextmanager
    def _locked(self, stripe: str = "") -> Iterator[None]:
        # flock excludes other processes; the thread lock keeps this process's threads
        # from each opening the lock file only to queue on it. A record change holds
        # its ref's stripe and may take the folder's lock inside it, never the reverse.
        with self._thread_locks[stripe]:
            fd = os.open(self._lock_path + stripe, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # closing the last descriptor lets the flock go

    def _record_path(self, ref: str) -> str:
        return f"{self._records}/{ref}.json"

    def _transact(self, ref: str, change: Change[T]) -> tuple[T, bool]:
        with self._locked(ref[:1] if ref[:1] in self._thread_locks else ""):
            old = self._read_record(ref)
            new, result, write = apply_change(old, change)
            if not write:
                return result, False
            if new is None:
                if old is not None:
                    self._forgotten(ref, old)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._record_path(ref))
                if self.durable:
                    _fsync_directory(self._records)
                return result, True
            if old is None:
                new = self._created(new)
            _write_atomically(self._record_path(ref), new.to_json(), self.durable)
            return result, False

    def _read_record(self, ref: str) -> PayloadRecord | None:
        try:
            data = _read_file(self._record_path(ref))
        except FileNotFoundError:
            return None
        return PayloadRecord.from_json(data, ref)

    def _write_blob(self, ref: str, data: bytes) -> None:
        # Straight to its name, not a temporary file renamed (a second directory
        # operation per payload, under the lock every writer of the folder takes): a
        # ref is new, and nothing reads its bytes before the publication carrying it,
        # which waits for this write; bytes a crash cut short never got one.
        path = f"{self._blobs}/{ref}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if self.durable:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            raise
        os.close(fd)
        if self.durable:
            _fsync_directory(self._blobs)

    def _share_blob(self, source: str, ref: str) -> None:
        # A second name for the same file: no byte is copied, and the bytes live until
        # the last of the refs naming them is reclaimed (each unlinks its own name).
        try:
            with self._names_locked(source):
                # Linked only while source's record holds the bytes: a reclamation
                # deletes the record before it drops the name, so a name added after
                # that would outlive the moment its bytes were counted free.
                if self._read_record(source) is None:
                    raise FileNotFoundError(source)
                os.link(f"{self._blobs}/{source}", f"{self._blobs}/{ref}")
        except FileNotFoundError:
            raise PayloadMissing(f"payload {source} has no bytes (reclaimed)",
                                 ref=source) from None
        if self.durable:
            _fsync_directory(self._blobs)

    @contextlib.contextmanager
    def _names_locked(self, ref: str) -> Iterator[int]:
        """Hold the lock on the file ref names, which every name of the same bytes
        shares (a flock is on the file, not the name): adding a name and dropping
        one never interleave, so exactly one drop sees itself the last.

        Yields:
            the open descriptor of the file.

        Raises:
            FileNotFoundError: ref has no bytes.
        """
        fd = os.open(f"{self._blobs}/{ref}", os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # the flock goes with the file's last descriptor of ours

    def _read_blob(self, ref: str) -> bytes | None:
        try:
            return _read_file(f"{self._blobs}/{ref}")
        except FileNotFoundError:
            return None

    def _drop_blob(self, ref: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{self._blobs}/{ref}")

    def _list_refs(self) -> list[str]:
        return [
            name[: -len(".json")]
            for name in os.listdir(self._records)
            if name.endswith(".json") and REF_PATTERN.match(name[: -len(".json")])
        ]

    def _list_blobs(self) -> list[str]:
        return [name for name in os.listdir(self._blobs) if REF_PATTERN.match(name)]


def _read_file(path: str) -> bytes:
    # os-level calls: io.open's buffered layers cost more than the read of a record.
    fd = os.open(path, os.O_RDONLY)
    try:
        size = max(os.fstat(fd).st_size, 4096)
        chunks = []
        while chunk := os.read(fd, size):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _write_atomically(path: str, data: bytes, durable: bool = True) -> None:
    folder, name = os.path.split(path)
    temporary = f"{folder}/.{name}.{os.getpid()}.{next(_TEMPORARIES)}.tmp"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    if durable:
        _fsync_directory(folder)


def _fsync_directory(directory: str) -> None:
    # A rename or unlink is durable only once the directory entry is on disk.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_TEMPORARIES: Final = itertools.count()
"""Names a write's temporary file, with the pid: unique without a uuid per write."""
