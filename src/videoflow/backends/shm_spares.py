"""Spare files of the shared-memory store: released payload files kept to be written
over, so a camera's next frame lands in pages that exist instead of new ones.

A memory filesystem gives a new file its pages one by one as they are written, each
zeroed first, and takes them back when the last name goes: for a 1080p frame (6.2 MB)
that was 3.4 ms of a camera's 7 ms per frame, and 0.3-0.6 ms of whichever reader
released it last. A spare skips both: the release renames the file into ``spares/``
instead of unlinking it, and the next put of a payload about its size claims it,
writes over it and renames it to its ref.

A file is only written over when nothing can read it: its record is gone (every
obligation released), and no process holds it open or mapped. The second is asked of
the kernel, which grants a write lease on a file only when no other open file refers
to it; a reader's mapping keeps its file open after the reader closed its descriptor,
so a view a node kept past its release still stops the file's reuse (it is removed
instead, and its pages live until that view goes). Where leases are missing or do
not see readers (checked once per folder, with a reader of its own), there are no
spares and every release unlinks, as before.

Spare bytes count in the store's budget (SharedMemoryPayloadStore._admit): a put
that would not fit discards spares before it waits.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
from typing import Final

__all__ = ["SPARE_FILES", "SPARE_MIN_BYTES", "SpareFiles"]

SPARE_FILES: Final = 16
"""The most spares a folder keeps: a few frames of each of eight cameras between a
release and the next put."""

SPARE_MIN_BYTES: Final = 256 * 1024
"""Smaller files are unlinked: a new file of that size costs less than the renames."""

_F_SETLEASE: Final = getattr(fcntl, "F_SETLEASE", None)
_F_WRLCK: Final = getattr(fcntl, "F_WRLCK", 1)
_F_UNLCK: Final = getattr(fcntl, "F_UNLCK", 2)
_SPARE_NAME: Final = re.compile(r"([0-9]+)\.([0-9]+)\.([0-9]+)")  # size.pid.n
_CLAIMED: Final = re.compile(r"\.claimed\.([0-9]+)\.[0-9]+")  # .claimed.pid.n
_NAMES: Final = itertools.count()
_LEASES_SEE_READERS: dict[int, bool] = {}  # per filesystem (st_dev), asked once


class SpareFiles:
    """The spares of one store folder, shared by every process that opens it.

    Arguments:
        directory: the folder's ``spares`` directory, created when missing.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self.enabled = _leases_see_readers(directory)

    def sizes(self) -> list[int]:
        """The sizes of the spares now (the budget counts them)."""
        return [size for size, _name in self._listed()]

    def keep(self, path: str) -> bool:
        """Make the payload file at path a spare, if it is worth keeping and there is
        room. The caller has deleted its record; the file is renamed, never copied.

        Returns:
            whether it was kept; False leaves path for the caller to unlink.
        """
        if not self.enabled:
            return False
        try:
            status = os.stat(path)
        except FileNotFoundError:
            return False
        # Another name still shares the bytes (a pass-through's link): not ours to keep.
        if status.st_nlink != 1 or status.st_size < SPARE_MIN_BYTES:
            return False
        if len(os.listdir(self.directory)) >= SPARE_FILES:
            return False
        name = f"{status.st_size}.{os.getpid()}.{next(_NAMES)}"
        try:
            os.rename(path, f"{self.directory}/{name}")
        except FileNotFoundError:
            return False
        return True

    def claim(self, size: int) -> str | None:
        """Take a spare to write a payload of size into: one of that size if there is
        one, else the smallest larger one, else the largest (a write that extends it
        still reuses what it has). It is renamed to a name of this process's first, so
        no other process takes it too, and given back to nobody: the caller writes it
        and renames it to its ref, or unlinks it.

        Returns:
            the claimed file's path, or None when no spare is free of readers.
        """
        if not self.enabled:
            return None
        spares = self._listed()
        spares.sort(key=lambda spare: (spare[0] != size, spare[0] < size,
                                       spare[0] if spare[0] >= size else -spare[0]))
        for _size, name in spares:
            claimed = f"{self.directory}/.claimed.{os.getpid()}.{next(_NAMES)}"
            try:
                os.rename(f"{self.directory}/{name}", claimed)
            except FileNotFoundError:
                continue  # another process claimed it first
            if _alone(claimed):
                return claimed
            # A reader still maps it: its pages are that reader's until it lets go.
            os.unlink(claimed)
        return None

    def discard(self, needed: int | None = None) -> int:
        """Unlink spares, largest first, until needed bytes are freed (every one when
        None) or none is left.

        Returns:
            the bytes freed.
        """
        freed = 0
        for size, name in sorted(self._listed(), reverse=True):
            if needed is not None and freed >= needed:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.directory}/{name}")
                freed += size
        return freed

    def _listed(self) -> list[tuple[int, str]]:
        spares = []
        for name in os.listdir(self.directory):
            if match := _SPARE_NAME.fullmatch(name):
                spares.append((int(match[1]), name))
            elif (match := _CLAIMED.fullmatch(name)) and not _alive(int(match[1])):
                # Claimed by a process that died before writing it: nobody's now.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{self.directory}/{name}")
        return spares


def _alone(path: str) -> bool:
    """Whether path's file has no other name and no open file refers to it but this
    one: a write lease is granted only then (and given back at once)."""
    lease = _F_SETLEASE
    if lease is None:  # a platform without leases cannot tell
        return False
    fd = os.open(path, os.O_WRONLY)
    try:
        if os.fstat(fd).st_nlink != 1:
            return False
        fcntl.fcntl(fd, lease, _F_WRLCK)
    except OSError:  # EAGAIN: open or mapped elsewhere
        return False
    else:
        fcntl.fcntl(fd, lease, _F_UNLCK)
        return True
    finally:
        os.close(fd)


def _leases_see_readers(directory: str) -> bool:
    """Whether this folder's filesystem refuses a write lease while a reader holds the
    file: what makes a spare safe to write over. Asked once per filesystem, with a
    probe file of the folder's own and a reader of this process."""
    if _F_SETLEASE is None:
        return False
    device = os.stat(directory).st_dev
    known = _LEASES_SEE_READERS.get(device)
    if known is not None:
        return known
    probe = f"{directory}/.probe.{os.getpid()}.{next(_NAMES)}"
    seen = False
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        if _alone(probe):
            reader = os.open(probe, os.O_RDONLY)
            try:
                seen = not _alone(probe)
            finally:
                os.close(reader)
    except OSError:  # no leases here (EINVAL, ENOLCK): no spares
        seen = False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(probe)
    _LEASES_SEE_READERS[device] = seen
    return seen


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's: alive
        return True
    return True
