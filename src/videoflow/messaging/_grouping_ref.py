"""Pure-Python reference of the grouping core.

The twin of the compiled ``_grouping_core`` (csrc/), behind the same interface:
``TraceCore`` and ``TimeCore``. ``VIDEOFLOW_PURE_PYTHON=1`` selects it; the
differential tests feed both the same streams and require identical output, so
this file is the executable specification of every rule the compiled core keeps.
It favours plain code over speed: the compiled twin is where speed lives.

Clocks: ``clock`` (and every ``now``) is the caller's monotonic clock; it times
the timeouts and the silence backstop, so a step of the wall clock moves none of
them. Event times are epoch seconds; an entry without one is stamped with ``epoch``
(the wall clock) as it is added.

Rules (both cores):

- *Resolving* an incomplete group: with at least ``quorum`` sync members it is
  staged for emission (missing parents as None, collect windows closed as they
  stand); below quorum it is discarded ('expired') unless ``missing='wait'``, in
  which case it keeps assembling and is staged as soon as it reaches quorum.
- Trace core: a group is resolved at its deadline, ``created + timeout`` on the
  monotonic clock.
- Time core: a group is resolved once every parent it lacks is *given up on*. A
  parent p is given up on for a group at time t when its event-time watermark (the
  greatest event_ts seen from p) has passed ``t + tolerance + disorder`` -- its data
  says its member is not coming, whatever the clock says (``disorder``, 0 by default,
  is how far out of event-time order a parent's messages may arrive) -- or, the
  backstop, when p has
  been silent for ``timeout``: no message from p since its last arrival (since the
  group's creation, for a parent never heard from) on the monotonic clock -- and
  then only once every collect window of the group could close (below): while a
  window still holds the group, a late member still joins it. An
  arrival is stamped with the clock's latest reading the core has taken: when a
  group is seeded, and at each sweep (and so each pop). ``heard(p, now)`` counts
  as an arrival from p at now: the caller says p has input waiting that it has not
  fed yet (parked locally, or still on the broker), so p is not silent, however
  long the caller itself was away -- a node that falls behind its parents, stalls
  in its own code, or starts late gives up on nothing its parents have sent.
  Incomplete groups are resolved in time order: the oldest one that cannot be
  resolved yet holds the later ones (a parent behind the group is behind every
  later group it lacks too), so each call resolves what it can and stops. A
  parent that runs ahead, lags or replays loses nothing that is complete in its
  data, and a dropped frame costs one frame period of waiting, not the timeout.
- A *late* group is one seeded by a message more than ``disorder`` behind its own
  parent's watermark that no held group takes (a redelivery or retry after its group was gone, or
  another replica of the parent). Its other members can only come out of order
  too, so no watermark gives one of them up: with a timeout it is resolved at its
  deadline, ``created + timeout``, and stands apart from the time order (it holds
  up no group behind it); with none, the watermarks judge it like any group. A
  late group resolved below quorum is discarded as 'late', not 'expired'.
- Diagnostics: ``waiting_for()`` names the parents the oldest incomplete group
  lacks and has not given up on by their data (trace core, a late group with a
  timeout, and a group held below quorum under ``missing='wait'``: every one it
  lacks);
  ``watermarks()`` (time core) is each parent's watermark, None before its first
  message.
- Beyond ``max_pending`` assembling groups, the oldest (by creation) is
  discarded ('evicted').
- A redelivery (same parent, trace_id and seq as a held message) swaps the
  held entry and handle in place; the old handle is released as 'superseded'.
- The core never calls a handle: whatever it lets go of is appended to
  ``released`` as (handle, reason), reason 'superseded' or the discard's
  ('evicted', 'expired', 'late', 'flushed'), in the order it happened. A call
  that leaves pairs there (add, sweep, pop, flush) ends by handing the list over,
  ``on_release(pairs)``, once the core is at rest, never in the middle of its
  work; ``released`` is then emptied (the assembler's resolver is its on_release,
  and keeps what it needs by copying: the list is the core's for its life).
  A core built without one keeps the pairs in ``released``.
- Ready groups come out in the order they became ready.

A time group with every sync parent present, or resolved with a quorum, waits for
its collect windows: the window of parent c closes
once c's watermark has passed ``t + w + disorder``, or, the backstop, once c has been silent
for ``timeout`` since its last arrival or ``heard`` (since the group's completion,
for a parent never heard from). Never by
the window's length in wall time: samples that exist are in the window, however
late they arrive. With no timeout there is no backstop.

Collect samples (time core): a sample at ``s`` of a parent with window ``w``
belongs to every group whose time ``t`` has ``|t - s| <= w``. It is *settled*
when no held group covers it and no future group can: ``s + w < X - tolerance -
disorder``, where ``X`` is the quorum-th lowest of the sync parents' event-time
watermarks (the greatest event_ts seen from each; -inf before a parent's first
message). A future group needs ``quorum`` members, each from a parent whose next
message lies no more than ``disorder`` behind its watermark, so no group seeded
below ``X - tolerance - disorder`` can ever be emitted. A message further out of
order than that may find samples already released. A settled sample that some emitted
group included has its handle handed out in the ReadyGroup being built when it
settles (the last group to include it), or else in the next ReadyGroup emitted;
a settled sample no group took is discarded ('expired'). Beyond ``max_pending``
buffered samples per collect parent the oldest leaves early the same way, with
'evicted' for an untaken one.

Over ~700 lines, as one file: it mirrors the compiled ``_grouping_core.pyx`` method for
method, so the two are read and changed side by side; a split of one and not the other
would lose that.
"""

from __future__ import annotations

import hashlib
import math
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from typing import Any

import numpy as np

CORE_KIND = "reference"
SUPERSEDED = "superseded"

_FREE, _ASSEMBLING, _CLOSING, _READY = 0, 1, 2, 3
_NEG_INF = float("-inf")
_NAN = float("nan")
_POS_INF = float("inf")
_COMPACT_SLACK = 32


_SEQ_MIN, _SEQ_MAX = -(2**63), 2**63 - 1


def seq_of(entry: Any) -> int:
    """An entry's seq, which the compiled twin keeps as a signed 64-bit integer."""
    seq: int = entry.seq
    if not _SEQ_MIN <= seq <= _SEQ_MAX:
        raise OverflowError(f"seq {seq} is outside the signed 64-bit range")
    return seq


def event_time(entry: Any, epoch: Callable[[], float]) -> float:
    """An entry's event time in epoch seconds, or the epoch clock's time (its arrival)
    for one without.

    Raises:
        ValueError: for a NaN or infinite event time, which no tolerance can match.
    """
    ts = entry.event_ts
    ts = float(epoch() if ts is None else ts)
    if not math.isfinite(ts):
        raise ValueError(f"event_ts {entry.event_ts!r} is not a finite time")
    return ts


def group_identity(keys: list[str]) -> str:
    """Returns the minted trace id of a time group from its members' canonical keys."""
    digest = hashlib.blake2b("".join(keys).encode("utf-8", "surrogatepass"), digest_size=8)
    return "tg-" + digest.hexdigest()


def search_window(times: Any, a: float, b: float) -> tuple[int, int]:
    """Index range [i, j) of the entries of a sorted time array with a <= t <= b."""
    return bisect_left(times, a), bisect_right(times, b)


class SortedTimes:
    """Event times kept sorted, each tagged with a slot; removal leaves a tombstone.

    A head offset makes removing the oldest free of moves; tombstones in the middle
    are compacted once they outnumber the live entries.
    """

    def __init__(self) -> None:
        self.t: list[float] = []
        self.s: list[int] = []
        self.lo = 0
        self.dead = 0

    def insert(self, t: float, slot: int) -> None:
        i = bisect_right(self.t, t, self.lo)
        self.t.insert(i, t)
        self.s.insert(i, slot)

    def bounds(self, a: float, b: float) -> tuple[int, int]:
        """Index range [i, j) of entries with a <= t <= b (tombstones included)."""
        return bisect_left(self.t, a, self.lo), bisect_right(self.t, b, self.lo)

    def remove(self, t: float, slot: int) -> None:
        i = bisect_left(self.t, t, self.lo)
        while self.s[i] != slot:
            i += 1
        self.s[i] = -1
        self.dead += 1
        self._trim()

    # Python-level access, as the compiled twin offers it to the oracle tests.

    def py_insert(self, t: float, slot: int) -> None:
        self.insert(t, slot)

    def py_remove(self, t: float, slot: int) -> None:
        self.remove(t, slot)

    def py_bounds(self, a: float, b: float) -> tuple[int, int]:
        return self.bounds(a, b)

    def live(self) -> tuple[np.ndarray, np.ndarray]:
        """(times, slots) of the live entries, in order, as numpy arrays."""
        keep = [i for i in range(self.lo, len(self.s)) if self.s[i] >= 0]
        return (
            np.array([self.t[i] for i in keep], dtype=np.float64),
            np.array([self.s[i] for i in keep], dtype=np.int64),
        )

    def _trim(self) -> None:
        t, s = self.t, self.s
        while self.lo < len(s) and s[self.lo] == -1:
            self.lo += 1
            self.dead -= 1
        while len(s) > self.lo and s[-1] == -1:
            t.pop()
            s.pop()
            self.dead -= 1
        live = len(s) - self.lo - self.dead
        if self.dead > live + _COMPACT_SLACK:
            keep = [i for i in range(self.lo, len(s)) if s[i] != -1]
            self.t = [t[i] for i in keep]
            self.s = [s[i] for i in keep]
            self.lo = 0
            self.dead = 0
        elif self.lo > _COMPACT_SLACK and self.lo * 2 > len(s):
            del t[: self.lo]
            del s[: self.lo]
            self.lo = 0


class _Core:
    """What both cores share: slot tables, creation FIFO, ready queue, counters."""

    def __init__(
        self,
        parent_names: list[str],
        timeout_s: float,
        quorum: int,
        max_pending: int,
        missing_wait: bool,
        clock: Callable[[], float],
        ready_factory: Callable[..., Any],
        on_release: Callable[[list[tuple[Any, str]]], object] | None = None,
    ) -> None:
        self.names = list(parent_names)
        self.n = len(self.names)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.timeout = timeout_s  # < 0: never
        self.quorum = quorum
        self.max_pending = max_pending
        self.missing_wait = missing_wait
        self.clock = clock
        self.ready_factory = ready_factory
        self.on_release = on_release
        self.evictions = 0
        # slot tables
        self.g_state: list[int] = []
        self.g_mask: list[int] = []
        self.g_count: list[int] = []
        self.g_created: list[float] = []
        self.g_serial: list[int] = []
        self.g_expired: list[bool] = []
        self.m_entry: list[Any] = []
        self.m_handle: list[Any] = []
        self.released: list[tuple[Any, str]] = []
        self.m_seq: list[int] = []
        self.m_ts: list[float] = []
        self.free: list[int] = []
        self.serial = 0
        # creation order: (slot, serial); dl_head for deadlines, age_head for eviction
        self.fifo: list[tuple[int, int]] = []
        self.dl_head = 0
        self.age_head = 0
        self.ready: list[tuple[int, int]] = []
        self.ready_head = 0
        self.assembling = 0
        self.held = [0] * self.n

    # -- slots -----------------------------------------------------------------

    def _alloc(self, now: float) -> int:
        if self.free:
            slot = self.free.pop()
        else:
            slot = len(self.g_state)
            self.g_state.append(_FREE)
            self.g_mask.append(0)
            self.g_count.append(0)
            self.g_created.append(0.0)
            self.g_serial.append(0)
            self.g_expired.append(False)
            self.m_entry.extend([None] * self.n)
            self.m_handle.extend([None] * self.n)
            self.m_seq.extend([0] * self.n)
            self.m_ts.extend([0.0] * self.n)
        self.serial += 1
        self.g_state[slot] = _ASSEMBLING
        self.g_mask[slot] = 0
        self.g_count[slot] = 0
        self.g_created[slot] = now
        self.g_serial[slot] = self.serial
        self.g_expired[slot] = False
        self.fifo.append((slot, self.serial))
        self.assembling += 1
        return slot

    def _release_slot(self, slot: int) -> list[Any]:
        """Frees a slot and returns the handles of its members."""
        handles = []
        base = slot * self.n
        mask = self.g_mask[slot]
        for p in range(self.n):
            if mask >> p & 1:
                handles.append(self.m_handle[base + p])
                self.m_entry[base + p] = None
                self.m_handle[base + p] = None
                self.held[p] -= 1
        if self.g_state[slot] == _ASSEMBLING:
            self.assembling -= 1
        self.g_state[slot] = _FREE
        self.g_mask[slot] = 0
        self.free.append(slot)
        return handles

    def _hand_over(self) -> None:
        """Ends a call that let something go (module rules)."""
        if self.on_release is not None:
            try:
                self.on_release(self.released)
            finally:
                self.released.clear()

    def _valid(self, item: tuple[int, int]) -> bool:
        return self.g_serial[item[0]] == item[1] and self.g_state[item[0]] != _FREE

    def _compact_fifo(self) -> None:
        """Moves both creation-order heads past groups that left assembly, then drops
        the prefix behind them, so the order list stays as long as what is pending."""
        fifo = self.fifo
        while self.age_head < len(fifo) and not (
            self._valid(fifo[self.age_head]) and self.g_state[fifo[self.age_head][0]] == _ASSEMBLING
        ):
            self.age_head += 1
        if self.timeout < 0:
            # No deadlines: the deadline head follows the age head, and never walks the
            # groups held below quorum under missing='wait' (as many as max_pending).
            self.dl_head = self.age_head
        else:
            while self.dl_head < len(fifo) and not (
                self._valid(fifo[self.dl_head])
                and self.g_state[fifo[self.dl_head][0]] == _ASSEMBLING
                and not self.g_expired[fifo[self.dl_head][0]]
            ):
                self.dl_head += 1
        head = min(self.dl_head, self.age_head)
        if head > _COMPACT_SLACK and head * 2 > len(fifo):
            del fifo[:head]
            self.dl_head -= head
            self.age_head -= head
        if self.ready_head > _COMPACT_SLACK and self.ready_head * 2 > len(self.ready):
            del self.ready[: self.ready_head]
            self.ready_head = 0

    # -- group life ------------------------------------------------------------

    def _join(self, slot: int, p: int, ts: float, entry: Any, handle: Any, seq: int) -> None:
        i = slot * self.n + p
        self.m_entry[i] = entry
        self.m_handle[i] = handle
        self.m_seq[i] = seq
        self.m_ts[i] = ts
        self.g_mask[slot] |= 1 << p
        self.g_count[slot] += 1
        self.held[p] += 1
        if self.g_count[slot] == self.n:
            self._complete(slot)
        elif self.g_expired[slot] and self.g_count[slot] >= self.quorum:
            self._stage(slot)

    def _complete(self, slot: int) -> None:
        self._stage(slot)

    def _stage(self, slot: int) -> None:
        if self.g_state[slot] == _ASSEMBLING:
            self.assembling -= 1
        self.g_state[slot] = _READY
        self.ready.append((slot, self.g_serial[slot]))

    def _supersede(self, i: int, entry: Any, handle: Any) -> None:
        old = self.m_handle[i]
        self.m_entry[i] = entry
        self.m_handle[i] = handle
        self.released.append((old, SUPERSEDED))

    def _discard_group(self, slot: int, reason: str) -> None:
        self._forget(slot)
        handles = self._release_slot(slot)
        self.evictions += 1
        for h in handles:
            self.released.append((h, reason))

    def _forget(self, slot: int) -> None:
        """Drops the group from any lookup structure before its slot is freed."""

    def _evict_over_capacity(self) -> None:
        while self.assembling > self.max_pending:
            while True:
                item = self.fifo[self.age_head]
                if self._valid(item) and self.g_state[item[0]] == _ASSEMBLING:
                    break
                self.age_head += 1
            self._discard_group(item[0], "evicted")
        self._compact_fifo()

    # -- public ----------------------------------------------------------------

    def sweep(self, now: float | None = None) -> None:
        self._sweep(self.clock() if now is None else now)
        if self.released:
            self._hand_over()

    def _sweep(self, now: float) -> None:
        if self.timeout >= 0:
            fifo = self.fifo
            while self.dl_head < len(fifo):
                item = fifo[self.dl_head]
                slot = item[0]
                if (
                    not self._valid(item)
                    or self.g_state[slot] != _ASSEMBLING
                    or self.g_expired[slot]
                ):
                    self.dl_head += 1
                    continue
                if self.g_created[slot] + self.timeout > now:
                    break
                self.dl_head += 1
                if self.g_count[slot] >= self.quorum:
                    self._stage(slot)
                elif self.missing_wait:
                    self.g_expired[slot] = True
                else:
                    self._discard_group(slot, "expired")
        self._compact_fifo()
        self._sweep_extra(now)

    def _sweep_extra(self, now: float) -> None:
        """Core-specific work after the deadline sweep."""

    def pop(self, now: float | None = None) -> Any:
        if now is None:
            now = self.clock()
        self._promote(now)
        self._sweep(now)
        group = self._drain_one(now)
        if self.released:
            self._hand_over()
        return group

    def _promote(self, now: float) -> None:
        """Moves groups whose last condition cleared into the ready queue."""

    def flush(self, now: float | None = None) -> list[Any]:
        """End of input: emits every group that holds a quorum, discards the rest
        ('flushed'), releases every buffered sample, and returns the groups in order."""
        groups = self._flush(self.clock() if now is None else now)
        if self.released:
            self._hand_over()
        return groups

    def _flush(self, now: float) -> list[Any]:
        for item in self.fifo[min(self.dl_head, self.age_head):]:
            if not self._valid(item):
                continue
            slot = item[0]
            state = self.g_state[slot]
            if state == _CLOSING or (state == _ASSEMBLING and self.g_count[slot] >= self.quorum):
                self._stage(slot)
            elif state == _ASSEMBLING:
                self._discard_group(slot, "flushed")
        self.dl_head = self.age_head = len(self.fifo)
        self._compact_fifo()
        groups = []
        while True:
            group = self._drain_one(now)
            if group is None:
                break
            groups.append(group)
        self._release_all(groups)
        return groups

    def _drain_one(self, now: float) -> Any:
        while self.ready_head < len(self.ready):
            item = self.ready[self.ready_head]
            self.ready_head += 1
            if self._valid(item):
                return self._emit(item[0])
        return None

    def _release_all(self, groups: list[Any]) -> None:
        """Releases buffered state after a flush."""

    def _settle(self, now: float) -> None:
        """Releases buffered state nothing can use any more."""

    def pending_count(self) -> int:
        return self.assembling

    def _oldest(self) -> int:
        """The slot of the oldest incomplete group (by creation), -1 for none."""
        if self.assembling == 0:
            return -1
        while True:
            item = self.fifo[self.age_head]
            if self._valid(item) and self.g_state[item[0]] == _ASSEMBLING:
                return item[0]
            self.age_head += 1

    def oldest_wait(self, now: float | None = None) -> float:
        slot = self._oldest()
        if slot < 0:
            return 0.0
        if now is None:
            now = self.clock()
        return max(0.0, now - self.g_created[slot])

    def waiting_for(self) -> list[str]:
        """The parents the oldest incomplete group waits for, in parent order: those
        it lacks and has not given up on by their data ([] when none is held)."""
        slot = self._oldest()
        if slot < 0:
            return []
        mask = self.g_mask[slot]
        return [name for p, name in enumerate(self.names)
                if not mask >> p & 1 and self._awaits(slot, p)]

    def _awaits(self, slot: int, p: int) -> bool:
        """Whether a group lacking parent p may still get p's member from its data."""
        return True

    def has_pending_from(self, parent_name: str) -> bool:
        return self.held[self.index[parent_name]] > 0

    def queue_lengths(self) -> tuple[int, int]:
        """(creation-order entries, ready-queue entries) held, for memory-bound tests."""
        return len(self.fifo), len(self.ready)

    def _members(self, slot: int) -> tuple[dict[str, Any], list[Any], float | None, int]:
        entries: dict[str, Any] = {}
        handles: list[Any] = []
        base = slot * self.n
        mask = self.g_mask[slot]
        event_ts = None
        seq = None
        for p in range(self.n):
            if mask >> p & 1:
                entries[self.names[p]] = self.m_entry[base + p]
                handles.append(self.m_handle[base + p])
                ts = self.m_ts[base + p]
                if ts == ts and (event_ts is None or ts < event_ts):
                    event_ts = ts
                s = self.m_seq[base + p]
                if seq is None or s < seq:
                    seq = s
            else:
                entries[self.names[p]] = None
        assert seq is not None  # an emitted group has at least one member
        return entries, handles, event_ts, seq

    def _emit(self, slot: int) -> Any:
        raise NotImplementedError


class TraceCore(_Core):
    """Groups by exact trace id; see the module docstring for the shared rules."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.by_trace: dict[str, list[int]] = {}

    def add(self, parent_name: str, entry: Any, handle: Any) -> None:
        p = self.index[parent_name]
        trace_id = entry.trace_id
        seq = seq_of(entry)
        slots = self.by_trace.get(trace_id)
        target = -1
        if slots is not None:
            bit = 1 << p
            for slot in slots:
                if self.g_mask[slot] & bit:
                    i = slot * self.n + p
                    if self.m_seq[i] == seq:
                        self._supersede(i, entry, handle)
                        self._hand_over()
                        return
                elif target < 0 and self.g_state[slot] == _ASSEMBLING:
                    target = slot
        if target < 0:
            target = self._alloc(self.clock())
            if slots is None:
                self.by_trace[trace_id] = [target]
            else:
                slots.append(target)
            self._evict_over_capacity()
        ts = entry.event_ts
        # NaN marks "no event time": a trace group of such halves has event_ts None.
        self._join(target, p, _NAN if ts is None else float(ts), entry, handle, seq)
        if self.released:  # evicted over capacity
            self._hand_over()

    def _forget(self, slot: int) -> None:
        base = slot * self.n
        mask = self.g_mask[slot]
        for p in range(self.n):
            if mask >> p & 1:
                trace_id = self.m_entry[base + p].trace_id
                break
        else:  # pragma: no cover - a group exists only with a member
            raise AssertionError("group without members")
        slots = self.by_trace[trace_id]
        slots.remove(slot)
        if not slots:
            del self.by_trace[trace_id]

    def _emit(self, slot: int) -> Any:
        entries, handles, event_ts, seq = self._members(slot)
        trace_id = next(e.trace_id for e in entries.values() if e is not None)
        self._forget(slot)
        self._release_slot(slot)
        return self.ready_factory(trace_id, seq, event_ts, entries, handles)


class TimeCore(_Core):
    """Groups by event time with collect windows; see the module docstring."""

    def __init__(
        self,
        parent_names: list[str],
        collect_names: list[str],
        windows_s: list[float],
        tolerance_s: float,
        timeout_s: float,
        quorum: int,
        max_pending: int,
        missing_wait: bool,
        clock: Callable[[], float],
        ready_factory: Callable[..., Any],
        collect_factory: Callable[..., Any],
        epoch: Callable[[], float] | None = None,
        on_release: Callable[[list[tuple[Any, str]]], object] | None = None,
        disorder_s: float = 0.0,
    ) -> None:
        super().__init__(
            parent_names, timeout_s, quorum, max_pending, missing_wait, clock, ready_factory,
            on_release,
        )
        self.epoch = time.time if epoch is None else epoch
        self.tol = tolerance_s
        self.disorder = disorder_s
        # How far a parent's watermark must pass a group's time to give the parent up.
        self.patience = tolerance_s + disorder_s
        self.g_time: list[float] = []
        self.g_completed: list[float] = []
        self.order = SortedTimes()
        self.closing: list[tuple[int, int]] = []
        self.wm = [_NEG_INF] * self.n
        self.last = [_NEG_INF] * self.n  # clock reading at each parent's latest arrival
        self.now_seen = _NEG_INF  # the clock's latest reading: at a seeding or a sweep
        self.horizon = _NEG_INF
        # The assembling groups no resolution has judged yet, by time: what the
        # resolution scan walks, so it never passes over ready or closing groups.
        self.waiting = SortedTimes()
        self.g_waiting: list[bool] = []
        # Late groups (seeded behind their parent's watermark), by creation: their
        # deadlines, created + timeout, come in this order.
        self.g_late: list[bool] = []
        self.late: list[tuple[int, int]] = []
        self.late_head = 0
        # collect parents
        self.c_names = list(collect_names)
        self.nc = len(self.c_names)
        self.c_index = {name: i for i, name in enumerate(self.c_names)}
        self.c_window = list(windows_s)
        self.c_wm = [_NEG_INF] * self.nc
        self.c_last = [_NEG_INF] * self.nc
        self.c_buf = [SortedTimes() for _ in range(self.nc)]
        self.c_held = [0] * self.nc
        self.c_live = [0] * self.nc
        # sample slot tables
        self.x_entry: list[Any] = []
        self.x_handle: list[Any] = []
        self.x_taken: list[bool] = []
        self.x_free: list[int] = []
        self.carry: list[Any] = []
        self.carry_from = [0] * self.nc
        self.collect_factory = collect_factory

    def _alloc(self, now: float) -> int:
        slot = super()._alloc(now)
        if slot == len(self.g_time):
            self.g_time.append(0.0)
            self.g_completed.append(0.0)
            self.g_waiting.append(False)
            self.g_late.append(False)
        return slot

    def _unwait(self, slot: int) -> None:
        if self.g_waiting[slot]:
            self.g_waiting[slot] = False
            self.waiting.remove(self.g_time[slot], slot)

    def _stage(self, slot: int) -> None:
        self._unwait(slot)
        super()._stage(slot)

    def _given_up(self, slot: int, now: float) -> bool:
        """Whether every sync parent the group lacks is given up on (module rules)."""
        beyond = self.g_time[slot] + self.patience
        created = self.g_created[slot]
        mask = self.g_mask[slot]
        timeout = self.timeout
        silence = False
        for p in range(self.n):
            if mask >> p & 1 or self.wm[p] > beyond:
                continue
            since = self.last[p] if self.last[p] > _NEG_INF else created
            if timeout < 0 or now < since + timeout:
                return False
            silence = True
        return not silence or self._windows_due(slot, now, created)

    def _windows_due(self, slot: int, now: float, unheard_since: float) -> bool:
        """Whether every collect window of the group could close now: its parent's
        watermark has passed it, or that parent has been silent for the timeout (since
        unheard_since, for one never heard from)."""
        t = self.g_time[slot]
        for c in range(self.nc):
            since = self.c_last[c] if self.c_last[c] > _NEG_INF else unheard_since
            if not (self.c_wm[c] > t + self.c_window[c] + self.disorder or (
                    self.timeout >= 0 and now >= since + self.timeout)):
                return False
        return True

    def _give_up(self, slot: int, reason: str) -> None:
        """Resolves an incomplete group: emitted with a quorum, else held (missing=
        'wait') or discarded for reason."""
        if self.g_count[slot] >= self.quorum:
            self._complete(slot)  # its collect windows still close on their own
        elif self.missing_wait:
            self._unwait(slot)
            self.g_expired[slot] = True
        else:
            self._discard_group(slot, reason)

    def _expire_late(self, now: float) -> None:
        """Resolves, oldest first, the late groups whose deadline has passed."""
        late = self.late
        while self.late_head < len(late):
            item = late[self.late_head]
            slot = item[0]
            if (self._valid(item) and self.g_state[slot] == _ASSEMBLING
                    and not self.g_expired[slot]):
                if now < self.g_created[slot] + self.timeout:
                    break
                self._give_up(slot, "late")
            self.late_head += 1
        if self.late_head > _COMPACT_SLACK and self.late_head * 2 > len(late):
            del late[: self.late_head]
            self.late_head = 0

    def _resolve(self, now: float) -> None:
        """Resolves, oldest first, the waiting groups whose missing parents are all
        given up on, up to the first that is not."""
        waiting = self.waiting
        due = []
        for k in range(waiting.lo, len(waiting.s)):
            slot = waiting.s[k]
            if slot < 0:
                continue
            if not self._given_up(slot, now):
                break
            due.append(slot)
        for slot in due:  # decided first: a discard edits the index being walked
            self._give_up(slot, "late" if self.g_late[slot] else "expired")

    def _sweep(self, now: float) -> None:
        self.now_seen = now
        self._expire_late(now)
        self._resolve(now)
        self._promote(now)  # a group just resolved may find its windows closed already
        self._compact_fifo()
        self._sweep_extra(now)

    def heard(self, parent_name: str, now: float | None = None) -> None:
        if now is None:
            now = self.clock()
        self.now_seen = now
        c = self.c_index.get(parent_name)
        if c is not None:
            self.c_last[c] = now
            return
        p = self.index.get(parent_name)
        if p is None:
            raise KeyError(parent_name)
        self.last[p] = now

    def _awaits(self, slot: int, p: int) -> bool:
        # A group held below quorum under missing='wait' takes any member still, and
        # a late group any until its deadline.
        return (self.g_expired[slot] or (self.g_late[slot] and self.timeout >= 0)
                or self.wm[p] <= self.g_time[slot] + self.patience)

    def watermarks(self) -> dict[str, float | None]:
        """Each parent's watermark (the greatest event_ts seen from it; None before its
        first message): the sync parents in order, then the collect parents."""
        marks = [*zip(self.names, self.wm, strict=True),
                 *zip(self.c_names, self.c_wm, strict=True)]
        return {name: None if mark == _NEG_INF else mark for name, mark in marks}

    def has_pending_from(self, parent_name: str) -> bool:
        c = self.c_index.get(parent_name)
        if c is not None:
            return self.c_live[c] > 0 or self.carry_from[c] > 0
        return self.held[self.index[parent_name]] > 0

    def add(self, parent_name: str, entry: Any, handle: Any) -> None:
        p = self.index.get(parent_name)
        if p is None:
            c = self.c_index.get(parent_name)
            if c is None:
                raise KeyError(parent_name)
            self._add_sample(c, entry, handle)
            if self.released:
                self._hand_over()
            return
        # No clock call per message (it cost a sixth of an add): an arrival is stamped
        # with the latest reading seen, taken afresh only when a group is seeded.
        now = self.now_seen
        ts = event_time(entry, self.epoch)
        seq = seq_of(entry)
        advanced, late = ts > self.wm[p], ts < self.wm[p] - self.disorder
        if advanced:
            self.wm[p] = ts
            if self.nc:
                self.horizon = sorted(self.wm)[self.quorum - 1]
        order = self.order
        tol = self.tol
        bit = 1 << p
        best = -1
        best_d = 0.0
        i, j = order.bounds(ts - tol, ts + tol)
        for k in range(i, j):
            slot = order.s[k]
            if slot < 0:
                continue
            if self.g_mask[slot] & bit:
                m = slot * self.n + p
                if self.m_seq[m] == seq and self.m_entry[m].trace_id == entry.trace_id:
                    self._supersede(m, entry, handle)
                    self._hand_over()
                    return
            elif self.g_state[slot] == _ASSEMBLING:
                d = abs(order.t[k] - ts)
                if d <= tol and (best < 0 or d < best_d):
                    best = slot
                    best_d = d
        if best < 0:
            now = self.now_seen = self.clock()
            best = self._alloc(now)
            self.g_time[best] = ts
            order.insert(ts, best)
            self.g_late[best] = late
            if late and self.timeout >= 0:
                # Its members can only come out of order too: only its deadline gives
                # it up, and it holds up no group behind it (module rules).
                self.late.append((best, self.g_serial[best]))
                self.g_waiting[best] = False  # stale on a reused slot, unset on a new one
            else:
                self.waiting.insert(ts, best)
                self.g_waiting[best] = True
            self._evict_over_capacity()
        self.last[p] = now
        self._join(best, p, ts, entry, handle, seq)
        waiting = self.waiting
        if advanced and waiting.lo < len(waiting.s):
            # Only the oldest waiting group can be resolved first, and p's watermark
            # moved: worth a scan only when that group lacks p and p has passed it.
            # (What silence resolves meanwhile, the next sweep does.)
            head = waiting.s[waiting.lo]
            if not self.g_mask[head] >> p & 1 and ts > self.g_time[head] + self.patience:
                self._resolve(now)
        if self.released:  # evicted over capacity, or given up by the watermark
            self._hand_over()

    def _complete(self, slot: int) -> None:
        if self.nc == 0:
            self._stage(slot)
            return
        self._unwait(slot)
        self.assembling -= 1
        self.g_state[slot] = _CLOSING
        self.g_completed[slot] = self.clock()
        self.closing.append((slot, self.g_serial[slot]))

    def _forget(self, slot: int) -> None:
        self._unwait(slot)
        self.order.remove(self.g_time[slot], slot)

    def _promote(self, now: float) -> None:
        if not self.closing:
            return
        still = []
        for item in self.closing:
            if not self._valid(item) or self.g_state[item[0]] != _CLOSING:
                continue
            slot = item[0]
            if self._windows_due(slot, now, self.g_completed[slot]):
                self._stage(slot)
            else:
                still.append(item)
        self.closing = still

    # -- collect samples ---------------------------------------------------------

    def _covered(self, s: float, w: float) -> bool:
        order = self.order
        i, j = order.bounds(s - w, s + w)
        for k in range(i, j):
            if order.s[k] >= 0 and abs(order.t[k] - s) <= w:
                return True
        return False

    def _settled(self, s: float, w: float) -> bool:
        return s + w < self.horizon - self.patience and not self._covered(s, w)

    def _add_sample(self, c: int, entry: Any, handle: Any) -> None:
        self.c_last[c] = self.clock()
        ts = event_time(entry, self.epoch)
        if ts > self.c_wm[c]:
            self.c_wm[c] = ts
        buf = self.c_buf[c]
        i, j = buf.bounds(ts, ts)
        for k in range(i, j):
            x = buf.s[k]
            if x >= 0:
                old = self.x_entry[x]
                if old.seq == entry.seq and old.trace_id == entry.trace_id:
                    old_handle = self.x_handle[x]
                    self.x_entry[x] = entry
                    self.x_handle[x] = handle
                    self.released.append((old_handle, SUPERSEDED))
                    return
        if self._settled(ts, self.c_window[c]):
            self.released.append((handle, "expired"))
            return
        if self.x_free:
            x = self.x_free.pop()
            self.x_entry[x] = entry
            self.x_handle[x] = handle
            self.x_taken[x] = False
        else:
            x = len(self.x_entry)
            self.x_entry.append(entry)
            self.x_handle.append(handle)
            self.x_taken.append(False)
        buf.insert(ts, x)
        self.c_live[c] += 1
        if self.c_live[c] > self.max_pending:
            k = buf.lo
            self._drop_sample(c, buf.t[k], buf.s[k], "evicted")

    def _drop_sample(self, c: int, ts: float, x: int, reason: str) -> Any:
        """Takes a sample out of its buffer; a taken one's handle joins the carry list,
        an untaken one is discarded with reason."""
        self.c_buf[c].remove(ts, x)
        self.c_live[c] -= 1
        handle = self.x_handle[x]
        taken = self.x_taken[x]
        self.x_entry[x] = None
        self.x_handle[x] = None
        self.x_free.append(x)
        if taken:
            self.carry.append((c, handle))
            self.carry_from[c] += 1
        else:
            self.released.append((handle, reason))

    def _settle(self, now: float) -> None:
        for c in range(self.nc):
            buf = self.c_buf[c]
            w = self.c_window[c]
            while buf.lo < len(buf.s):
                k = buf.lo
                if not self._settled(buf.t[k], w):
                    break
                self._drop_sample(c, buf.t[k], buf.s[k], "expired")

    def _sweep_extra(self, now: float) -> None:
        if self.nc:
            self._settle(now)

    def _flush(self, now: float) -> list[Any]:
        # Complete groups still waiting on a window go first, windows closed as they stand.
        for item in self.closing:
            if self._valid(item) and self.g_state[item[0]] == _CLOSING:
                self._stage(item[0])
        self.closing = []
        horizon = self.horizon
        # No group can follow the end of input, so every sample settles once the
        # groups that cover it are out.
        self.horizon = _POS_INF
        try:
            groups = super()._flush(now)
        finally:
            self.horizon = horizon
        return groups

    def _release_all(self, groups: list[Any]) -> None:
        for c in range(self.nc):
            buf = self.c_buf[c]
            while buf.lo < len(buf.s):
                k = buf.lo
                self._drop_sample(c, buf.t[k], buf.s[k], "flushed")
        if self.carry:
            if groups:
                for c, h in self.carry:
                    groups[-1].handles.append(h)
                    self.carry_from[c] -= 1
            else:
                for c, h in self.carry:
                    self.carry_from[c] -= 1
                    self.released.append((h, "flushed"))
            self.carry = []

    def _emit(self, slot: int) -> Any:
        entries, handles, event_ts, seq = self._members(slot)
        keys = []
        base = slot * self.n
        mask = self.g_mask[slot]
        for p in range(self.n):
            if mask >> p & 1:
                e = self.m_entry[base + p]
                keys.append(f"{self.names[p]}\x00{e.trace_id}\x00{self.m_seq[base + p]}\x00")
        t = self.g_time[slot]
        self._forget(slot)
        self._release_slot(slot)
        for c in range(self.nc):
            w = self.c_window[c]
            buf = self.c_buf[c]
            messages: list[Any] = []
            metadata: list[Any] = []
            times: list[float] = []
            i, j = buf.bounds(t - w, t + w)
            settled = []
            for k in range(i, j):
                x = buf.s[k]
                if x < 0:
                    continue
                s = buf.t[k]
                if abs(s - t) > w:
                    continue
                e = self.x_entry[x]
                messages.append(e.message)
                metadata.append(e.metadata)
                times.append(s)
                self.x_taken[x] = True
                if self._settled(s, w):
                    settled.append((s, x))
            for s, x in settled:
                self._drop_sample(c, s, x, "expired")
            entries[self.c_names[c]] = self.collect_factory(messages, metadata, times)
        if self.carry:
            for c, h in self.carry:
                handles.append(h)
                self.carry_from[c] -= 1
            self.carry = []
        return self.ready_factory(group_identity(keys), seq, event_ts, entries, handles)
