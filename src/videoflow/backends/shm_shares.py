"""Shares of the shared-memory payload budget: no writer can take the room another needs.

The shared-memory store (videoflow.backends.shm_payload) bounds the bytes its payloads
hold by one budget for every process of the run. With one pool, two cameras running
ahead (a recorded source) filled it with frames a time join held for a third, live
camera; that camera's first put then waited for room that only its own frames could
make (issue 39: 0 of 150 groups, every camera failed after 60 s). So the budget is
cut in shares, one per writer, a writer being one replica of one node, (node, replica).

The rule, for a put of size bytes by writer w:

- Each *active* writer's share is (budget - floors) // the number of active writers.
  A writer is active from its first put attempt on. A writer that died still holding
  bytes stays active, so what it holds stays inside its share.
- A *dormant* writer (declared by the engine, videoflow.run.local, before any replica
  starts, and not yet put) reserves only a floor: one payload of the largest size
  admitted so far (0 before any). A camera that starts late writes its first frame at
  once, while a node that writes no frames (a sensor, a fusion node's small outputs,
  anything under the 64 KiB offload threshold never puts) costs the others one
  frame's room, not a share. The floors together take at most half the budget, and
  never so much that the largest payload no longer fits an otherwise empty store.
- The put is admitted when it stays within w's share (or w holds nothing, so a writer
  can always hold one payload) and the bytes held, spares included (spares are
  discarded first), stay within the budget less the floors still reserved. Else w
  waits, and only w: a put within its share never waits on another writer's bytes,
  except, once, on what a writer holds above a share that just shrank (a new writer
  became active): that writer may add nothing until it is back within its share.
  The room an active writer leaves unused is not lent to the others: lent, it could
  not be had back when that writer puts.
- How long a writer over its share may wait (budget_wait_seconds): a leader over its
  share legitimately waits while a join holds its frames for a lagging parent, so the
  engine gives it the longest join timeout of the flow on top of the default wait.

The table of writers (node, replica, bytes held, dormant or active, when its current
wait began and how long it has waited in all, on the host's monotonic clock, which
every process shares) and the largest payload admitted sit in one file of the store's
folder, read and written once per put under the folder's lock (about 6 us for 20
writers). A put that does not fit recounts what the payload files hold, per writer
their records name, to correct counts a crash left too high; it corrects only the
counts it can know, its own writer's and the dead writers', since another live
writer's reservations not yet written are in no file. Bytes without a writer's record
count in the total and belong to no writer.

A release frees bytes in three steps: its record goes, then its file, then (under the
folder's lock, once for a whole group) the count. A recount that runs in between no
longer finds the bytes, and the count-down would take them off a second time: the
writer could then hold a payload more than its share, and the store one more than its
budget. So a recount notes, per writer it corrects, when it ended, and a release
counts down only where no recount ended after its record began to go; one that did
may have seen the bytes or not, and leaves the count high until the next recount
(never low).

A writer is alive while its process holds the exclusive flock it took on its own file
under ``writers/`` at its first put: the kernel lets the lock go when the process
dies, so another process that gets it (and gives it back at once) knows the writer is
dead. A dead writer's bytes are freed by their readers' releases, as anyone's; once
it holds none, an undeclared writer leaves the table (the others' shares grow) and a
declared one is dormant again, keeping a floor for its restart: a restarted camera
whose share the others had taken would wait for room its own frames make, the very
starvation the shares are for.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, NamedTuple

import msgspec

__all__ = ["FLOORS_SHARE", "REFRESH_SECONDS", "Fit", "Freed", "TableFile", "Writer", "WriterEntry",
           "WriterLiveness", "WriterShares", "WriterState", "WriterTable", "anonymous_writer",
           "checked_writer", "floors", "writer_states"]

Writer = tuple[str, int]
"""A writer: (node name, replica id). The anonymous writer of a store opened without
one (tests, tools) is ('', a number unique to that store instance)."""

FLOORS_SHARE: Final = 2
"""The floors of dormant writers take at most 1/FLOORS_SHARE of the budget."""

REFRESH_SECONDS: Final = 0.5
"""How often, at most, a store instance whose put does not fit probes the writers'
liveness and recounts what is held."""

_LENGTH: Final = struct.Struct("<I")  # the encoded table's length, before it
_FIRST_READ: Final = 4096
_ANONYMOUS: Final = itertools.count()


# gc=False: entries and tables hold only numbers, strings and the list of entries, never
# a cycle; untracked, a table of 20 writers decodes in two thirds of the time.
class WriterEntry(msgspec.Struct, array_like=True, gc=False):
    """One writer's row of the table (mutable: the store changes it under its lock).

    Attributes:
        node / replica: the writer.
        held: the bytes of payloads its puts were charged for and not yet freed.
        active: it has attempted a put (else it is dormant and reserves a floor).
        declared: the engine declared it (a dead one with nothing held goes dormant
            again rather than leaving the table).
        pid: the process that last took its liveness lock; 0 when none did since it
            was declared (only a writer that took it can be found dead).
        wait_began: the monotonic time its current wait for room began; None when
            it is not waiting.
        waited: the seconds its waits that ended (admitted or failed) lasted in all.
        recounted: the monotonic time the last recount of its count ended (0: none).
    """

    node: str
    replica: int
    held: int = 0
    active: bool = False
    declared: bool = False
    pid: int = 0
    wait_began: float | None = None
    waited: float = 0.0
    recounted: float = 0.0

    @property
    def writer(self) -> Writer:
        return (self.node, self.replica)

    def end_wait(self, now: float | None) -> None:
        """Clear the current wait; count it into waited up to now (None: not at all,
        a wait its process died in, whose end nobody saw)."""
        if self.wait_began is not None and now is not None:
            self.waited += max(0.0, now - self.wait_began)
        self.wait_began = None


class WriterTable(msgspec.Struct, array_like=True, gc=False):
    """The writers of one store folder and what the budget's shares are computed from.

    Attributes:
        writers: one entry per writer.
        largest: the largest payload admitted so far: a dormant writer's floor.
        unattributed: bytes held that belong to no writer in the table (found by a
            recount without a readable record, or freed for a writer no longer in it).
        unattributed_recounted: the monotonic time the last recount of the
            unattributed bytes ended (0: none).
    """

    writers: list[WriterEntry] = msgspec.field(default_factory=list)
    largest: int = 0
    unattributed: int = 0
    unattributed_recounted: float = 0.0

    def entry(self, writer: Writer) -> WriterEntry | None:
        """writer's entry, None when it has none."""
        node, replica = writer
        for entry in self.writers:
            if entry.replica == replica and entry.node == node:
                return entry
        return None

    def held(self) -> int:
        """The bytes the store's payloads hold, spares aside."""
        return sum(entry.held for entry in self.writers) + self.unattributed

    def floors(self, budget: int, largest: int | None = None) -> int:
        """The room the dormant writers reserve (see floors)."""
        size = self.largest if largest is None else largest
        return floors(sum(1 for entry in self.writers if not entry.active), size, budget)

    def share(self, budget: int, largest: int | None = None) -> int:
        """An active writer's share of budget: what the floors leave, split evenly."""
        active = sum(1 for entry in self.writers if entry.active)
        return (budget - self.floors(budget, largest)) // max(active, 1)

    def enter(self, writer: Writer, pid: int | None) -> tuple[WriterEntry, bool]:
        """writer's entry for a put it attempts: made (when missing) and active.

        Arguments:
            pid: this process's, when it holds writer's liveness lock; a process new to
                the entry (a restarted replica) clears a wait its predecessor died in.

        Returns:
            the entry, and whether the table changed.
        """
        entry = self.entry(writer)
        changed = entry is None
        if entry is None:
            entry = WriterEntry(*writer)
            self.writers.append(entry)
        if not entry.active:
            entry.active = changed = True
        if pid is not None and entry.pid != pid:
            entry.pid, changed = pid, True
            entry.end_wait(None)
        return entry, changed

    def fit(self, entry: WriterEntry, size: int, budget: int) -> Fit:
        """How a put of size bytes by entry's (active) writer stands against budget,
        with size counted in the largest payload (the floors it sets include its own).
        The arithmetic of held, floors and share in one pass: it runs on every put.
        """
        active = held = 0
        for other in self.writers:
            active += other.active
            held += other.held
        reserved = floors(len(self.writers) - active, max(self.largest, size), budget)
        share = (budget - reserved) // max(active, 1)
        return Fit(share, entry.held == 0 or entry.held + size <= share,
                   held + self.unattributed + size - (budget - reserved))

    def admitted(self, entry: WriterEntry, size: int, now: float) -> None:
        """Charge entry's writer for size bytes, and end its wait."""
        entry.held += size
        self.largest = max(self.largest, size)
        entry.end_wait(now)

    def declare(self, writer: Writer) -> None:
        """Add writer as declared, dormant until its first put (kept as it is when it
        has an entry already)."""
        entry = self.entry(writer)
        if entry is None:
            self.writers.append(WriterEntry(*writer, declared=True))
        else:
            entry.declared = True

    def count_down(self, freed: Iterable[Freed]) -> None:
        """Take freed bytes off the writers they were charged to (None, or a writer no
        longer in the table: off the unattributed bytes), except where a recount of
        that count ended after their release began: it counted them already, or not at
        all, so they stay counted until the next recount rather than count free twice.
        Never below 0."""
        for writer, size, since in freed:
            entry = None if writer is None else self.entry(writer)
            if entry is None:
                if since > self.unattributed_recounted:
                    self.unattributed = max(0, self.unattributed - size)
            elif since > entry.recounted:
                entry.held = max(0, entry.held - size)

    def recounted(self, counts: Mapping[Writer | None, int],
                  exact: Mapping[Writer, int], now: float) -> None:
        """Correct the counts a recount can know: what it found charged to each writer
        of exact, plus the bytes that writer has reserved and not written yet; and the
        bytes of no writer in the table (None, or gone from it), unattributed.

        A live writer of another process keeps its count: the recount cannot see its
        reservations in flight (admitted, their file not written yet), and taking them
        off let it past its share by a payload each time, into the floors (its own
        recount, when it waits, corrects it).

        Arguments:
            counts: per writer, the bytes of the payload files its records name.
            exact: the writers to correct (the recounting process's own, the dead),
                each with its bytes in flight.
            now: the monotonic time the files were counted by (taken after).
        """
        left = dict(counts)
        for entry in self.writers:
            found = left.pop(entry.writer, 0)
            in_flight = exact.get(entry.writer)
            if in_flight is not None:
                entry.held, entry.recounted = found + in_flight, now
        self.unattributed, self.unattributed_recounted = sum(left.values()), now

    def forget_dead(self, dead: Iterable[Writer]) -> bool:
        """Apply what a liveness probe found: a dead writer is waiting no more; once it
        holds nothing, a declared one is dormant again (a floor kept for its restart)
        and any other leaves the table.

        Returns:
            whether the table changed.
        """
        changed = False
        for writer in dead:
            entry = self.entry(writer)
            if entry is None:
                continue
            if entry.wait_began is not None:
                entry.end_wait(None)
                changed = True
            if entry.held:
                continue  # its bytes stay inside its share until they are freed
            changed = True
            if entry.declared:
                entry.active, entry.pid = False, 0
            else:
                self.writers.remove(entry)
        return changed


class Freed(NamedTuple):
    """Bytes a release (or a failed put's reservation) frees, to count down.

    Attributes:
        writer: the writer they were charged to (None: no writer).
        size: how many.
        since: the monotonic time their release began, taken before their record
            went (WriterTable.count_down).
    """

    writer: Writer | None
    size: int
    since: float


class Fit(NamedTuple):
    """Where a put stands (WriterTable.fit).

    Attributes:
        share: the writer's share, the put's payload counted in the floors.
        within_share: the put keeps the writer within it (or the writer holds nothing).
        over: by how much the bytes held plus the put exceed the room the floors
            leave, spares aside; <= 0: room enough without discarding a spare.
    """

    share: int
    within_share: bool
    over: int


def floors(dormant: int, largest: int, budget: int) -> int:
    """The room dormant writers reserve in budget: one payload of the largest size
    admitted each, but at most 1/FLOORS_SHARE of the budget, and never so much that a
    payload of that size no longer fits an otherwise empty store (a budget of less
    than two frames holds one frame at a time, whoever is dormant).

    Arguments:
        dormant: how many writers are dormant.
        largest: the largest payload admitted (a put's own size counted).
        budget: the store's budget.
    """
    return max(0, min(dormant * largest, budget // FLOORS_SHARE, budget - largest))


@dataclass(frozen=True)
class WriterState:
    """What one writer holds of the shared-memory budget, for operators and joins.

    Attributes:
        node / replica: the writer ('' for a store opened without one).
        held_bytes: the bytes of its payloads not yet freed.
        share_bytes: its share of the budget; None while dormant (it reserves one
            payload's floor instead).
        active: whether it has attempted a put.
        alive: whether its process holds its liveness lock; None when it never took
            one (not probed).
        waiting_seconds: how long its current wait for room has lasted; None when it
            is not waiting.
        waited_seconds: how long its ended waits lasted in all.
    """

    node: str
    replica: int
    held_bytes: int
    share_bytes: int | None
    active: bool
    alive: bool | None
    waiting_seconds: float | None
    waited_seconds: float


def writer_states(table: WriterTable, budget: int, alive: Mapping[Writer, bool],
                  now: float) -> list[WriterState]:
    """The table's writers as WriterStates.

    Arguments:
        alive: the probe's verdict per writer probed (WriterLiveness.probe).
        now: the monotonic time the waits are measured to.
    """
    share = table.share(budget)
    states = []
    for entry in table.writers:
        living = alive.get(entry.writer)
        waiting = (None if entry.wait_began is None or living is False
                   else max(0.0, now - entry.wait_began))
        states.append(WriterState(entry.node, entry.replica, entry.held,
                                  share if entry.active else None, entry.active, living,
                                  waiting, entry.waited))
    return states


class TableFile:
    """The file the writer table lives in. The caller holds the store's folder lock
    around a load and the store that follows it.

    Arguments:
        path: the file (created by the first store).
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def load(self) -> WriterTable | None:
        """The table; None when there is none yet, or a crash left it unreadable (the
        caller rebuilds it from what is mapped).

        Raises:
            OSError: the folder cannot be read.
        """
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            data = os.pread(fd, _FIRST_READ, 0)
            if len(data) < _LENGTH.size:
                return None
            (length,) = _LENGTH.unpack_from(data)
            end = _LENGTH.size + length
            if len(data) < end:
                data += os.pread(fd, end - len(data), len(data))
        finally:
            os.close(fd)
        try:
            return _DECODER.decode(memoryview(data)[_LENGTH.size:end])
        except (msgspec.DecodeError, ValueError):
            return None

    def store(self, table: WriterTable) -> None:
        """Write the table in place, with one write: the length first, so whatever a
        longer earlier version left after it is never read.

        Raises:
            OSError: the folder cannot be written.
        """
        data = _ENCODER.encode(table)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, _LENGTH.pack(len(data)) + data, 0)
        finally:
            os.close(fd)


_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder(WriterTable)


class WriterLiveness:
    """The liveness locks of one store folder's writers (``writers/<node>.<replica>``).

    A lock this process took is kept, with its descriptor, for the process's life, in
    one registry for every store instance (flock excludes two descriptions of one file
    even in one process, so two instances of a writer share the one lock).

    Arguments:
        directory: the folder's ``writers`` directory (created at the first attach).
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def path(self, writer: Writer) -> str:
        node, replica = writer
        # Hex: any node name is a safe file name, and two names never meet in one.
        return f"{self.directory}/{node.encode().hex() or '-'}.{replica}"

    def holds(self, writer: Writer) -> bool:
        """Whether this process holds writer's lock."""
        return self.path(writer) in _HELD

    def attach(self, writer: Writer) -> bool:
        """Take writer's lock for this process's life, unless it holds it already.

        Returns:
            whether this process holds it now; False while another process does (a
            prober, for a moment, or a process still exiting as its replica's next one
            starts): the caller tries again later.

        Raises:
            OSError: the folder cannot be written.
        """
        path = self.path(writer)
        with _HELD_LOCK:
            if path in _HELD:
                return True
            # Not makedirs: a store folder removed at the end of its run stays gone.
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.directory)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            except BaseException:
                os.close(fd)
                raise
            _HELD[path] = fd
            return True

    def probe(self, writers: Iterable[Writer]) -> dict[Writer, bool]:
        """Whether each writer's process is alive: this process's own are; another's
        is alive while its lock cannot be taken (taken, it is given back at once).

        Returns:
            per writer, True (alive) or False (dead, or its lock file is gone).
        """
        alive = {}
        for writer in writers:
            path = self.path(writer)
            if path in _HELD:
                alive[writer] = True
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                alive[writer] = False
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                alive[writer] = True
            else:
                alive[writer] = False  # closing the descriptor gives the lock back
            finally:
                os.close(fd)
        return alive


# A process forked from a writer's (not exec'd) shares its lock, and keeps the writer
# looking alive while it lives: replicas are spawned, and nothing here runs between a
# fork and its exec (the embedded broker's restart forks with a preexec_fn).
_HELD: dict[str, int] = {}  # lock file path -> the descriptor holding its flock
_HELD_LOCK: Final = threading.Lock()


class WriterShares:
    """One store instance's part in its folder's writer table: the writer it puts as,
    the table's file, the liveness locks, the reservations it has in flight, and how
    often it probes and recounts. The caller holds the store's folder lock around
    load, store and whatever changes the table in between; attached and flying take
    no lock of the folder's.

    Arguments:
        directory: the store's folder.
        writer: the writer the instance puts as.
        count_bytes: the store's recount: per writer its records name (None: no
            readable record), the bytes of the payload files.
    """

    def __init__(self, directory: str, writer: Writer,
                 count_bytes: Callable[[], dict[Writer | None, int]]) -> None:
        self.writer = writer
        self.file = TableFile(f"{directory}/shares")
        self.liveness = WriterLiveness(f"{directory}/writers")
        self._lock_path = self.liveness.path(writer)
        self._count_bytes = count_bytes
        # The bytes this instance's puts reserved and have not written yet: the only
        # reservations a recount can know are not lost (see refresh).
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        self._refreshed_at = self._attach_tried_at = -REFRESH_SECONDS

    def load(self) -> WriterTable:
        """The writer table; rebuilt from what is mapped when there is none (a new
        folder) or a crash tore it (its declarations are then lost)."""
        table = self.file.load()
        if table is None:
            table = WriterTable()
            counts = self._count_bytes()
            table.recounted(counts, {}, time.monotonic())
        return table

    def store(self, table: WriterTable) -> None:
        self.file.store(table)

    def attached(self) -> int | None:
        """This process's pid once it holds its writer's liveness lock, taken at the
        first put (and tried again at most every REFRESH_SECONDS while another
        process holds it); None until then."""
        if self._lock_path not in _HELD:  # the path made once: this runs on every put
            now = time.monotonic()
            if now - self._attach_tried_at < REFRESH_SECONDS:
                return None
            self._attach_tried_at = now
            if not self.liveness.attach(self.writer):
                return None
        return os.getpid()

    def flying(self, size: int) -> None:
        """size bytes more (less, when negative) reserved and not written yet."""
        with self._in_flight_lock:
            self._in_flight += size

    def refresh_soon(self) -> None:
        """Let the next put that does not fit refresh at once (bytes vanished)."""
        self._refreshed_at = -REFRESH_SECONDS

    def refresh(self, table: WriterTable) -> bool:
        """On a put that does not fit: forget the writers found dead, and recount what
        is held, at most once per REFRESH_SECONDS per instance (with the budget full,
        a listing per frame was a tenth of a camera's time).

        A count drifts only upward (a crash between a reservation and its record,
        bytes deleted by hand), and what is mapped is the truth, less the reservations
        not written yet: the recount corrects this instance's writer (its own are
        known), the dead writers' (theirs died with them) and the bytes of no writer.

        Returns:
            whether the table changed.
        """
        now = time.monotonic()
        if now - self._refreshed_at < REFRESH_SECONDS:
            return False
        self._refreshed_at = now
        dead = [writer for writer, up in self.probe(table).items() if not up]
        table.forget_dead(dead)
        # Read before the listing: a reservation written meanwhile is then counted
        # twice (too high, for a moment), never not at all.
        with self._in_flight_lock:
            exact = {writer: 0 for writer in dead} | {self.writer: self._in_flight}
        counts = self._count_bytes()
        table.recounted(counts, exact, time.monotonic())
        return True

    def probe(self, table: WriterTable) -> dict[Writer, bool]:
        """Whether each writer of table that took its liveness lock is alive."""
        return self.liveness.probe([entry.writer for entry in table.writers if entry.pid])

    def end_wait(self, table: WriterTable) -> bool:
        """This instance's writer's wait ended without an admission (failed, or
        interrupted).

        Returns:
            whether the table changed.
        """
        entry = table.entry(self.writer)
        if entry is None or entry.wait_began is None:
            return False
        entry.end_wait(time.monotonic())
        return True


def anonymous_writer() -> Writer:
    """A writer of its own for a store opened without one: ('', a number made of the
    pid and a count, unique to the instance among the processes alive)."""
    return ("", os.getpid() << 20 | next(_ANONYMOUS) & 0xFFFFF)


def checked_writer(writer: object) -> Writer:
    """writer as a (node, replica) pair.

    Raises:
        ValueError: not a pair of a str and an int >= 0.
    """
    if (isinstance(writer, (tuple, list)) and len(writer) == 2
            and isinstance(writer[0], str)
            and isinstance(writer[1], int) and not isinstance(writer[1], bool)
            and writer[1] >= 0):
        return (writer[0], writer[1])
    raise ValueError(f"a writer is a (node name, replica id >= 0) pair, not {writer!r}")
