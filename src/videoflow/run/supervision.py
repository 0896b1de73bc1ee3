"""Process supervision of the local engine: what it needs beside starting processes.

- StopSignals: the engine's SIGINT and SIGTERM, counted alike (the first asks the flow
  to stop, the second quiesces every replica, the third kills them), so what systemd,
  docker stop, Kubernetes or ``timeout`` send behaves as a first Ctrl-C.
- die_with_parent: a replica process never outlives its engine (Linux:
  PR_SET_PDEATHSIG; everywhere: a thread that watches the engine).
- InHandSlot / read_in_hand: which deliveries a replica has in hand (the input group
  its node is processing), in a small file-backed mapping the engine created, so the
  engine can read them after the process died without a word.
- CrashBook / CrashCounts: per node, how many process deaths each input coincided
  with; the engine keeps the book, replicas read it, and a redelivered input whose
  count reached the run's crash_limit is dead-lettered as 'crashed_worker' instead of
  being processed again (messenger_deliveries.Deliveries.crash_looped).

Scope: the local engine (videoflow.run.local.run_flow), whose replicas are its own
child processes. ``videoflow worker`` processes on other hosts are restarted by their
own supervisor (systemd, Kubernetes), which knows nothing of their inputs: they are
not covered, and an input that crashes them is redelivered until its delivery policy's
broker-side max_deliver runs out.
"""

from __future__ import annotations

import ctypes
import functools
import json
import mmap
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Final

PR_SET_PDEATHSIG: Final = 1
"""prctl option: the signal this process gets when the thread that forked it dies."""

QUIESCE_SIGNAL: Final = getattr(signal, "SIGUSR1", signal.SIGTERM)
"""What quiesces a replica of the local engine (the engine's second Ctrl-C): SIGUSR1,
which nobody but the engine sends, not SIGTERM, which systemd and ``timeout`` send to
the whole process group, replicas included, and which the engine alone answers (as
it answers Ctrl-C). A ``videoflow worker`` quiesces on SIGTERM."""

PARENT_SIGNAL: Final = QUIESCE_SIGNAL
"""What a replica gets when its engine dies: the quiesce signal, not SIGKILL. The
replica quiesces (RUN-030: its prefetched inputs go back to the broker at once, a
producer stops producing), as the engine's own second Ctrl-C would have it do, rather
than holding its leases until ack_wait lapses. A replica that cannot quiesce (stuck in
a node's native code, or in a broker call that waits out its timeout) is ended by
die_with_parent's watch ORPHAN_GRACE_SECONDS later."""

WATCH_SECONDS: Final = 1.0
"""How often a replica checks that its engine still lives."""

ORPHAN_GRACE_SECONDS: Final = 3.0
"""How long a replica whose engine died may take to quiesce before it exits anyway."""

ORPHAN_EXIT_CODE: Final = 70
"""The exit code of a replica that ended itself because its engine was gone."""

SLOT_ENTRIES: Final = 64
"""The most deliveries a slot records for one input group: every member of a join
(at most 64 sync parents); a collect window's samples, which come after the members,
beyond that are not recorded."""

_COUNT: Final = struct.Struct("<I")
_ENTRY: Final = struct.Struct("<IQ")  # parent index, stream sequence
_HEADER: Final = 8
SLOT_BYTES: Final = _HEADER + _ENTRY.size * SLOT_ENTRIES


def exit_description(exitcode: int | None) -> str:
    """How a process ended, as the report says it: 'killed by SIGKILL', 'exit code 1'.

    Arguments:
        exitcode: multiprocessing's exitcode (negative: the signal that ended it), or
            None for a process not known to have ended.
    """
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


# ------------------------------------------------------------------ engine signals


class StopSignals:
    """The engine's SIGINT and SIGTERM, both counted as presses of Ctrl-C.

    Before the engine supervises, the handler raises KeyboardInterrupt, as Ctrl-C
    does there (provisioning is given up, the run torn down). From then on
    (supervising True) it only counts: the supervision loop acts on the count between
    its steps, so a signal never lands in the middle of reading a report off a pipe or
    of publishing the stop. Once the loop is done (finished True), the reaping and the
    teardown are not cut short by a first or second signal; the third in all raises
    KeyboardInterrupt, so a teardown waiting on a broker that is gone can still be
    abandoned.

    Handlers can be installed on the main thread only: elsewhere install() does
    nothing and the process's own handlers stay.

    Attributes:
        received: signals counted since supervising.
        first: the number of the first of them (SIGINT or SIGTERM), None before one:
            the run's report names it, and the videoflow command exits 128 + it, as a
            shell reports a command that signal ended.
        supervising: whether the handler counts (True) or raises (False).
        finished: whether the supervision loop is done.
    """

    def __init__(self) -> None:
        self.received = 0
        self.first: int | None = None
        self.supervising = False
        self.finished = False
        self._previous: dict[int, Any] = {}

    def install(self) -> StopSignals:
        """Handle SIGINT and SIGTERM here (main thread only).

        Returns:
            self.
        """
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def restore(self) -> None:
        """Put back the handlers install() replaced."""
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if not self.supervising:
            raise KeyboardInterrupt
        self.received += 1
        if self.first is None:
            self.first = signum
        if self.finished and self.received >= 3:
            raise KeyboardInterrupt


# ------------------------------------------------------------------ parent death


def die_with_parent(parent_pid: int | None = None, *, pdeathsig: bool = True,
                    grace: float = ORPHAN_GRACE_SECONDS) -> bool:
    """Make this process end when its parent (the engine) dies: the first thing a
    replica process does.

    On Linux, PR_SET_PDEATHSIG asks the kernel for PARENT_SIGNAL when the process that
    forked this one dies (strictly: the thread that forked it). That is the engine for
    a spawned replica, and the engine's replica server for a forked one
    (videoflow.run.replica_starts), which ends as soon as the engine does. Everywhere,
    and as a backstop on Linux, a daemon thread watches the engine: through
    multiprocessing's parent sentinel, which closes the moment the engine dies, for a
    process multiprocessing started (parent_pid None); else by comparing os.getppid()
    with parent_pid every WATCH_SECONDS. Once the engine is gone it sends this process
    PARENT_SIGNAL (unless the kernel did), and grace seconds later ends the process
    (os._exit) if it still runs. An engine that died before this call is noticed at
    once.

    Arguments:
        parent_pid: for a process not started by multiprocessing, the pid of the
            parent to watch; None: the process that started this one through
            multiprocessing, whichever process forked it.
        pdeathsig: use PR_SET_PDEATHSIG where there is one (tests turn it off to
            exercise the watch alone).
        grace: how long a quiesce may take once the parent is gone.

    Returns:
        whether the kernel will signal this process (PR_SET_PDEATHSIG took).

    Raises:
        ValueError: parent_pid is None in a process multiprocessing did not start.
    """
    armed = pdeathsig and _set_pdeathsig(PARENT_SIGNAL)
    if parent_pid is None:
        parent = multiprocessing.parent_process()
        if parent is None:
            raise ValueError("not started by multiprocessing: name the parent's pid")
        sentinel = parent.sentinel
        if multiprocessing.connection.wait([sentinel], timeout=0):
            os._exit(ORPHAN_EXIT_CODE)  # died before we looked: nobody would signal us
        watch: Callable[[], object] = functools.partial(
            multiprocessing.connection.wait, [sentinel])
    else:
        if os.getppid() != parent_pid:  # died before the prctl: nobody would signal us
            os._exit(ORPHAN_EXIT_CODE)
        watch = functools.partial(_while_parent_is, parent_pid)
    threading.Thread(target=_orphaned_after, args=(watch, armed, grace),
                     name="videoflow-parent-watch", daemon=True).start()
    return armed


def _set_pdeathsig(signum: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)) == 0
    except (OSError, AttributeError):  # no libc to ask: the watch alone covers it
        return False


def _while_parent_is(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(WATCH_SECONDS)


def _orphaned_after(watch: Callable[[], object], signalled: bool, grace: float) -> None:
    watch()  # returns once the parent is gone
    if not signalled:
        os.kill(os.getpid(), PARENT_SIGNAL)
    time.sleep(grace)
    os._exit(ORPHAN_EXIT_CODE)


# ------------------------------------------------------------------ the run's files

DIRECTORY_PREFIX: Final = "videoflow-supervision-"


def supervision_directory() -> Path:
    """A fresh directory for one run's supervision files (slots, crash books), named
    by this engine's pid: in /dev/shm where there is one (the slots are written per
    input group: memory, not a disk), else the temporary directory. The directories
    of engines that died without removing theirs (SIGKILL) are removed first.

    Returns:
        the directory; the caller removes it at the run's end.
    """
    shm = Path("/dev/shm")
    root = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    _sweep(root)
    return Path(tempfile.mkdtemp(prefix=f"{DIRECTORY_PREFIX}{os.getpid()}-", dir=root))


def _sweep(root: Path) -> None:
    if os.name != "posix":  # os.kill(pid, 0) probes only on POSIX (Windows kills)
        return
    for entry in root.glob(f"{DIRECTORY_PREFIX}*"):
        pid = entry.name[len(DIRECTORY_PREFIX):].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:  # its engine is gone
            shutil.rmtree(entry, ignore_errors=True)
        except PermissionError:  # another user's engine, alive
            pass


# ------------------------------------------------------------------ inputs in hand


def create_slot(path: str | os.PathLike[str]) -> None:
    """Create (or clear) a replica's in-hand slot: the engine, before it starts the
    replica's first process."""
    Path(path).write_bytes(bytes(SLOT_BYTES))


class InHandSlot:
    """A replica's record of the deliveries its node has in hand, written into a
    mapping of the slot file the engine created: no system call per group, so it costs
    the hot path a few struct packs. The count is written after the entries and
    cleared before they change, so a process killed mid-write leaves either the
    previous group cleared or the new one whole.

    Arguments:
        path: the slot file (create_slot).
        parents: the node's parents, in wiring order: entries name a parent by index.
    """

    def __init__(self, path: str | os.PathLike[str], parents: Sequence[str]) -> None:
        with open(path, "r+b") as file:
            self._map = mmap.mmap(file.fileno(), SLOT_BYTES)
        self._index = {parent: i for i, parent in enumerate(parents)}
        self._held = False

    def hold(self, handles: Iterable[Any]) -> None:
        """Record the deliveries of one input group (its handles' parent and
        delivery.stream_seq), the first SLOT_ENTRIES of them."""
        buffer, index, pack = self._map, self._index, _ENTRY.pack_into
        if self._held:
            _COUNT.pack_into(buffer, 0, 0)
        n = 0
        for handle in handles:
            i = index.get(handle.parent)
            if i is None:
                continue
            pack(buffer, _HEADER + _ENTRY.size * n, i, handle.delivery.stream_seq)
            n += 1
            if n == SLOT_ENTRIES:
                break
        _COUNT.pack_into(buffer, 0, n)
        self._held = True

    def release(self) -> None:
        """Nothing in hand any more (the group was acknowledged or failed)."""
        if self._held:
            _COUNT.pack_into(self._map, 0, 0)
            self._held = False

    def close(self) -> None:
        self._map.close()


def read_in_hand(path: str | os.PathLike[str],
                 parents: Sequence[str]) -> list[tuple[str, int]]:
    """What a replica's slot says its node had in hand: (parent, stream_seq) pairs.

    Arguments:
        path: the slot file.
        parents: the node's parents, in wiring order.

    Returns:
        the deliveries; [] when nothing was in hand or the file is gone.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    if len(data) < SLOT_BYTES:
        return []
    (count,) = _COUNT.unpack_from(data, 0)
    found = []
    for n in range(min(count, SLOT_ENTRIES)):
        i, seq = _ENTRY.unpack_from(data, _HEADER + _ENTRY.size * n)
        if i < len(parents):
            found.append((parents[i], seq))
    return found


# ------------------------------------------------------------------ crash counts


class CrashBook:
    """The engine's count, per node, of the process deaths each delivery coincided
    with, kept in one file per node that the node's replicas read (CrashCounts).
    Per node, not per replica: competing replicas share a durable, so an input that
    killed one replica's process may come back to another.

    Arguments:
        directory: where the files go (the run's supervision directory).
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._deaths: dict[str, dict[tuple[str, int], list[str]]] = {}

    def path(self, node: str) -> Path:
        """The node's file, which its replicas read."""
        from videoflow.core.naming import sanitize

        return self.directory / f"{sanitize(node)}.crashes.json"

    def count(self, node: str, in_hand: Iterable[tuple[str, int]], how: str) -> None:
        """Count one death of a process of node against each delivery it had in hand,
        and rewrite the node's file (whole: written aside, then renamed over it).

        Arguments:
            node: the node.
            in_hand: the (parent, stream_seq) deliveries (read_in_hand).
            how: how the process ended (exit_description).
        """
        book = self._deaths.setdefault(node, {})
        for delivery in in_hand:
            book.setdefault(delivery, []).append(how)
        rows = [[parent, seq, hows] for (parent, seq), hows in sorted(book.items())]
        path = self.path(node)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps({"deaths": rows}))
        os.replace(partial, path)

    def deaths(self, node: str, parent: str, stream_seq: int) -> list[str]:
        """How each process death the delivery coincided with ended, oldest first."""
        return list(self._deaths.get(node, {}).get((parent, stream_seq), ()))


class CrashCounts:
    """A replica's reading of its node's CrashBook file. The file is read again only
    when it changed (one stat per lookup), and lookups are for redeliveries only: an
    input that came with a process death is always a redelivery.

    Arguments:
        path: the node's file (CrashBook.path); it need not exist yet.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._seen: tuple[int, int, int] | None = None
        self._deaths: dict[tuple[str, int], list[str]] = {}

    def deaths(self, parent: str, stream_seq: int) -> list[str]:
        """How each process death this delivery coincided with ended (empty: none)."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return []
        seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if seen != self._seen:
            try:
                rows = json.loads(self.path.read_text())["deaths"]
            except (OSError, ValueError, KeyError, TypeError):
                return list(self._deaths.get((parent, stream_seq), ()))
            self._deaths = {(str(p), int(s)): [str(h) for h in hows] for p, s, hows in rows}
            self._seen = seen
        return list(self._deaths.get((parent, stream_seq), ()))


__all__ = [
    "ORPHAN_EXIT_CODE",
    "ORPHAN_GRACE_SECONDS",
    "PARENT_SIGNAL",
    "QUIESCE_SIGNAL",
    "SLOT_ENTRIES",
    "CrashBook",
    "CrashCounts",
    "InHandSlot",
    "StopSignals",
    "create_slot",
    "die_with_parent",
    "exit_description",
    "read_in_hand",
    "supervision_directory",
]
