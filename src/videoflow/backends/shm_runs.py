"""Where a run's shared-memory payload store is, and whether this process sees it.

A run provisioned for workers (videoflow provision) may keep its payloads in one host's
shared memory. Its store's folder holds a mark, a random id the provisioning wrote and
the run spec records: a worker finds the same mark only where it sees the same
/dev/shm (the same host and mount namespace). Elsewhere a folder of that name is
another store, or none, and the worker would publish refs no other replica could read
and wait for ones it can never read.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Final

from videoflow.backends.shm_payload import shm_root
from videoflow.core.naming import sanitize

_MARK: Final = "store.mark"


def run_store_dir(flow_id: str, run_id: str) -> Path:
    """The folder of one run's shared-memory store (the local engine's, or a run
    provisioned with its payloads in shared memory)."""
    return shm_root() / sanitize(flow_id) / sanitize(run_id)


def mark_store(directory: str | os.PathLike[str]) -> str:
    """The store's mark: a random id kept in its folder, made by the first call. A
    replica given the mark finds it in the folder only where it sees the same shared
    memory (the same host and mount namespace): store_mark.

    Raises:
        OSError: the folder cannot be written.
    """
    path = Path(directory) / _MARK
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        found = store_mark(directory)
        if found is None:
            raise OSError(f"{path} holds no store mark") from None
        return found
    mark = uuid.uuid4().hex
    try:
        os.write(fd, mark.encode())
    finally:
        os.close(fd)
    return mark


def store_mark(directory: str | os.PathLike[str]) -> str | None:
    """The mark mark_store left in directory; None where there is none (another
    host's shared memory, or a folder nobody marked)."""
    try:
        return (Path(directory) / _MARK).read_text().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


__all__ = ["mark_store", "run_store_dir", "store_mark"]
