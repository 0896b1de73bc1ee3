"""A replica's stdout whose reader may stop reading (`videoflow run F | head -1`), and
the one way videoflow sends a descriptor nobody reads to /dev/null."""

from __future__ import annotations

import os
import select
import stat
import threading
from typing import Any


def to_devnull(*fds: int) -> None:
    """Point each descriptor at /dev/null: what is written there after is dropped, not
    refused with a broken pipe (at exit, Python's own flush included)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in fds:
            os.dup2(devnull, fd)
    finally:
        os.close(devnull)


class UnreadStdout:
    """A replica's sys.stdout, whose reader may stop reading (`videoflow run F | head
    -1`): a write the closed pipe refuses is no failure of the node's input, which
    would be retried and dead-lettered. Its descriptor goes to /dev/null (what it held
    and every later line with it) and gone is set, for the engine to stop the run as a
    pipeline ends."""

    def __init__(self, stream: Any) -> None:
        self._stream, self.gone = stream, threading.Event()

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            self._nowhere()
            return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._nowhere()

    def watch(self) -> None:
        """Notice the reader going before any write does, on a thread: a pipe whose
        reader closed polls as an error. A node writing to the descriptor itself
        (os.write, sys.stdout.buffer, native code) would otherwise fail its input."""
        fd = self._stream.fileno()
        if not hasattr(select, "poll") or not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
        poller = select.poll()
        poller.register(fd, select.POLLERR)

        def wait() -> None:
            while not self.gone.is_set():
                if poller.poll(1000):  # only an error (or a hang-up) is asked for
                    self._nowhere()

        threading.Thread(target=wait, name="videoflow-stdout-reader", daemon=True).start()

    def _nowhere(self) -> None:
        fd = self._stream.fileno()
        gone = os.fstat(fd)
        # stderr too, when it is the same pipe (2>&1)
        to_devnull(fd, *((2,) if fd != 2 and _same_file(2, gone) else ()))
        try:
            self._stream.flush()  # what the buffer held, to /dev/null now
        except BrokenPipeError:
            pass
        self.gone.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _same_file(fd: int, other: os.stat_result) -> bool:
    try:
        mine = os.fstat(fd)
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (other.st_dev, other.st_ino)


__all__ = ["UnreadStdout", "to_devnull"]
