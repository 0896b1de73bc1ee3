# cython: language_level=3
"""Compiled grouping core: the twin of ``videoflow.messaging._grouping_ref``.

Same interface, same rules (stated in the reference's docstring), C types in the
hot loops: event times in sorted double arrays with a head offset and tombstones,
presence as 64-bit masks, creation order and the ready queue as int64 rings. The
kernels trust their inputs: ``grouping.py`` validates the policy and parents
before a core exists. Entries and handles are opaque objects in list slot tables,
never called: what the core lets go of (a held delivery its redelivery superseded, the
members of a group or the samples it discarded) goes on ``released`` as
(handle, reason) pairs, and a call that leaves pairs there ends by handing the list to
its owner's ``on_release`` (the reference states when).
"""

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.math cimport INFINITY, NAN, fabs, isfinite
from libc.stdint cimport int64_t, uint64_t

from videoflow.messaging._timeline cimport (
    COMPACT_SLACK,
    SlotQueue,
    SortedTimes,
    grow_buffer,
    lower_bound,
    upper_bound,
)

import hashlib
import time

CORE_KIND = "compiled"
SUPERSEDED = "superseded"

cdef enum:
    FREE = 0
    ASSEMBLING = 1
    CLOSING = 2
    READY = 3


cdef int64_t _seq_of(object entry) except? -1:
    """An entry's seq as a signed 64-bit integer."""
    try:
        return entry.seq
    except OverflowError:
        raise OverflowError(f"seq {entry.seq} is outside the signed 64-bit range") from None


cdef double _event_time(object entry, object epoch) except? -1.0:
    """An entry's event time in seconds, or the epoch clock's time for one without."""
    cdef object tso = entry.event_ts
    cdef double ts = epoch() if tso is None else tso
    if not isfinite(ts):
        raise ValueError(f"event_ts {tso!r} is not a finite time")
    return ts


def group_identity(list keys):
    """Returns the minted trace id of a time group from its members' canonical keys."""
    digest = hashlib.blake2b("".join(keys).encode("utf-8", "surrogatepass"), digest_size=8)
    return "tg-" + digest.hexdigest()


cdef class _Core:
    """Slot tables, creation order, ready queue and counters both cores share."""

    cdef readonly list names
    cdef Py_ssize_t n
    cdef dict index
    cdef double timeout
    cdef Py_ssize_t quorum, max_pending
    cdef bint missing_wait
    cdef object clock, ready_factory, on_release
    cdef readonly long long evictions
    # slot tables
    cdef Py_ssize_t g_cap, n_slots
    cdef char* g_state
    cdef uint64_t* g_mask
    cdef Py_ssize_t* g_count
    cdef double* g_created
    cdef int64_t* g_serial
    cdef char* g_expired
    cdef Py_ssize_t m_cap
    cdef int64_t* m_seq
    cdef double* m_ts
    cdef list m_entry, m_handle
    cdef readonly list released
    cdef Py_ssize_t free_cap, n_free
    cdef int64_t* free
    cdef int64_t serial
    cdef SlotQueue fifo, ready
    cdef Py_ssize_t dl_head, age_head, ready_head
    cdef Py_ssize_t assembling
    cdef Py_ssize_t* held

    def __cinit__(self, *args, **kwargs):
        self.g_state = NULL
        self.g_mask = NULL
        self.g_count = NULL
        self.g_created = NULL
        self.g_serial = NULL
        self.g_expired = NULL
        self.m_seq = NULL
        self.m_ts = NULL
        self.free = NULL
        self.held = NULL
        self.g_cap = self.m_cap = self.free_cap = 0

    def __dealloc__(self):
        PyMem_Free(self.g_state)
        PyMem_Free(self.g_mask)
        PyMem_Free(self.g_count)
        PyMem_Free(self.g_created)
        PyMem_Free(self.g_serial)
        PyMem_Free(self.g_expired)
        PyMem_Free(self.m_seq)
        PyMem_Free(self.m_ts)
        PyMem_Free(self.free)
        PyMem_Free(self.held)

    cdef int _setup(self, list parent_names, double timeout_s, Py_ssize_t quorum,
                    Py_ssize_t max_pending, bint missing_wait, object clock,
                    object ready_factory, object on_release) except -1:
        cdef Py_ssize_t i
        self.names = list(parent_names)
        self.n = len(self.names)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.timeout = timeout_s
        self.quorum = quorum
        self.max_pending = max_pending
        self.missing_wait = missing_wait
        self.clock = clock
        self.ready_factory = ready_factory
        self.on_release = on_release
        self.evictions = 0
        self.n_slots = 0
        self.n_free = 0
        self.serial = 0
        self.m_entry = []
        self.m_handle = []
        self.released = []
        self.fifo = SlotQueue()
        self.ready = SlotQueue()
        self.dl_head = self.age_head = self.ready_head = 0
        self.assembling = 0
        self.held = <Py_ssize_t*>PyMem_Malloc(<size_t>max(self.n, 1) * sizeof(Py_ssize_t))
        if self.held == NULL:
            raise MemoryError()
        for i in range(self.n):
            self.held[i] = 0
        return 0

    # -- slots -----------------------------------------------------------------

    cdef int _grow_slots(self) except -1:
        cdef Py_ssize_t need = self.n_slots + 1, cap
        if need > self.g_cap:
            cap = self.g_cap
            grow_buffer(<void**>&self.g_state, &cap, need, sizeof(char))
            cap = self.g_cap
            grow_buffer(<void**>&self.g_mask, &cap, need, sizeof(uint64_t))
            cap = self.g_cap
            grow_buffer(<void**>&self.g_count, &cap, need, sizeof(Py_ssize_t))
            cap = self.g_cap
            grow_buffer(<void**>&self.g_created, &cap, need, sizeof(double))
            cap = self.g_cap
            grow_buffer(<void**>&self.g_serial, &cap, need, sizeof(int64_t))
            cap = self.g_cap
            grow_buffer(<void**>&self.g_expired, &cap, need, sizeof(char))
            self._grow_extra(cap)
            self.g_cap = cap
            need = cap * self.n
            cap = self.m_cap
            grow_buffer(<void**>&self.m_seq, &cap, need, sizeof(int64_t))
            cap = self.m_cap
            grow_buffer(<void**>&self.m_ts, &cap, need, sizeof(double))
            self.m_cap = cap
        self.m_entry.extend([None] * self.n)
        self.m_handle.extend([None] * self.n)
        self.n_slots += 1
        return 0

    cdef int _grow_extra(self, Py_ssize_t cap) except -1:
        return 0

    cdef Py_ssize_t _alloc(self, double now) except -1:
        cdef Py_ssize_t slot
        if self.n_free > 0:
            self.n_free -= 1
            slot = self.free[self.n_free]
        else:
            slot = self.n_slots
            self._grow_slots()
        self.serial += 1
        self.g_state[slot] = ASSEMBLING
        self.g_mask[slot] = 0
        self.g_count[slot] = 0
        self.g_created[slot] = now
        self.g_serial[slot] = self.serial
        self.g_expired[slot] = 0
        self.fifo.push(slot, self.serial)
        self.assembling += 1
        return slot

    cdef list _release_slot(self, Py_ssize_t slot):
        """Frees a slot and returns the handles of its members."""
        cdef list handles = []
        cdef Py_ssize_t base = slot * self.n, p, cap
        cdef uint64_t mask = self.g_mask[slot]
        for p in range(self.n):
            if (mask >> p) & 1:
                handles.append(self.m_handle[base + p])
                self.m_entry[base + p] = None
                self.m_handle[base + p] = None
                self.held[p] -= 1
        if self.g_state[slot] == ASSEMBLING:
            self.assembling -= 1
        self.g_state[slot] = FREE
        self.g_mask[slot] = 0
        if self.n_free + 1 > self.free_cap:
            cap = self.free_cap
            grow_buffer(<void**>&self.free, &cap, self.n_free + 1, sizeof(int64_t))
            self.free_cap = cap
        self.free[self.n_free] = slot
        self.n_free += 1
        return handles

    cdef int _hand_over(self) except -1:
        """Ends a call that let something go (see the reference): the list is the
        core's own for its life, emptied once the resolver returned."""
        if self.on_release is not None:
            try:
                self.on_release(self.released)
            finally:
                del self.released[:]
        return 0

    cdef inline bint _valid(self, SlotQueue q, Py_ssize_t k) noexcept:
        cdef int64_t slot = q.slot[k]
        return self.g_serial[slot] == q.serial[k] and self.g_state[slot] != FREE

    cdef void _compact_fifo(self) noexcept:
        """Moves both creation-order heads past groups that left assembly, then drops
        the prefix behind them, so the order queue stays as long as what is pending."""
        cdef SlotQueue fifo = self.fifo
        cdef Py_ssize_t head
        while self.age_head < fifo.n and not (
                self._valid(fifo, self.age_head)
                and self.g_state[fifo.slot[self.age_head]] == ASSEMBLING):
            self.age_head += 1
        if self.timeout < 0:
            # No deadlines: the deadline head follows the age head, and never walks the
            # groups held below quorum under missing='wait' (as many as max_pending).
            self.dl_head = self.age_head
        else:
            while self.dl_head < fifo.n and not (
                    self._valid(fifo, self.dl_head)
                    and self.g_state[fifo.slot[self.dl_head]] == ASSEMBLING
                    and not self.g_expired[fifo.slot[self.dl_head]]):
                self.dl_head += 1
        head = min(self.dl_head, self.age_head)
        if head > COMPACT_SLACK and head * 2 > fifo.n:
            fifo.drop_prefix(head)
            self.dl_head -= head
            self.age_head -= head
        if self.ready_head > COMPACT_SLACK and self.ready_head * 2 > self.ready.n:
            self.ready.drop_prefix(self.ready_head)
            self.ready_head = 0

    # -- group life ------------------------------------------------------------

    cdef int _join(self, Py_ssize_t slot, Py_ssize_t p, double ts, object entry,
                   object handle, int64_t seq) except -1:
        cdef Py_ssize_t i = slot * self.n + p
        self.m_entry[i] = entry
        self.m_handle[i] = handle
        self.m_seq[i] = seq
        self.m_ts[i] = ts
        self.g_mask[slot] |= (<uint64_t>1) << p
        self.g_count[slot] += 1
        self.held[p] += 1
        if self.g_count[slot] == self.n:
            self._complete(slot)
        elif self.g_expired[slot] and self.g_count[slot] >= self.quorum:
            self._stage(slot)
        return 0

    cdef int _complete(self, Py_ssize_t slot) except -1:
        return self._stage(slot)

    cdef int _stage(self, Py_ssize_t slot) except -1:
        if self.g_state[slot] == ASSEMBLING:
            self.assembling -= 1
        self.g_state[slot] = READY
        self.ready.push(slot, self.g_serial[slot])
        return 0

    cdef int _supersede(self, Py_ssize_t i, object entry, object handle) except -1:
        old = self.m_handle[i]
        self.m_entry[i] = entry
        self.m_handle[i] = handle
        self.released.append((old, SUPERSEDED))
        return 0

    cdef int _discard_group(self, Py_ssize_t slot, str reason) except -1:
        self._forget(slot)
        cdef list handles = self._release_slot(slot)
        self.evictions += 1
        for h in handles:
            self.released.append((h, reason))
        return 0

    cdef int _forget(self, Py_ssize_t slot) except -1:
        return 0

    cdef int _evict_over_capacity(self) except -1:
        cdef Py_ssize_t slot
        while self.assembling > self.max_pending:
            while True:
                slot = self.fifo.slot[self.age_head]
                if self._valid(self.fifo, self.age_head) and self.g_state[slot] == ASSEMBLING:
                    break
                self.age_head += 1
            self._discard_group(slot, "evicted")
        self._compact_fifo()
        return 0

    # -- public ----------------------------------------------------------------

    def sweep(self, now=None):
        self._sweep(self.clock() if now is None else now)
        if self.released:
            self._hand_over()

    cdef int _sweep(self, double now) except -1:
        cdef Py_ssize_t slot
        if self.timeout >= 0:
            while self.dl_head < self.fifo.n:
                slot = self.fifo.slot[self.dl_head]
                if (not self._valid(self.fifo, self.dl_head)
                        or self.g_state[slot] != ASSEMBLING or self.g_expired[slot]):
                    self.dl_head += 1
                    continue
                if self.g_created[slot] + self.timeout > now:
                    break
                self.dl_head += 1
                if self.g_count[slot] >= self.quorum:
                    self._stage(slot)
                elif self.missing_wait:
                    self.g_expired[slot] = 1
                else:
                    self._discard_group(slot, "expired")
        self._compact_fifo()
        self._sweep_extra(now)
        return 0

    cdef int _sweep_extra(self, double now) except -1:
        return 0

    def pop(self, now=None):
        cdef double t_now = self.clock() if now is None else now
        self._promote(t_now)
        self._sweep(t_now)
        group = self._drain_one()
        if self.released:
            self._hand_over()
        return group

    cdef object _drain_one(self):
        cdef Py_ssize_t k
        while self.ready_head < self.ready.n:
            k = self.ready_head
            self.ready_head += 1
            if self._valid(self.ready, k):
                return self._emit(self.ready.slot[k])
        return None

    cdef int _promote(self, double now) except -1:
        return 0

    def flush(self, now=None):
        cdef list groups = self._flush(self.clock() if now is None else now)
        if self.released:
            self._hand_over()
        return groups

    cdef list _flush(self, double now):
        cdef Py_ssize_t k, slot
        cdef char state
        for k in range(min(self.dl_head, self.age_head), self.fifo.n):
            if not self._valid(self.fifo, k):
                continue
            slot = self.fifo.slot[k]
            state = self.g_state[slot]
            if state == CLOSING or (state == ASSEMBLING and self.g_count[slot] >= self.quorum):
                self._stage(slot)
            elif state == ASSEMBLING:
                self._discard_group(slot, "flushed")
        self.dl_head = self.age_head = self.fifo.n
        self._compact_fifo()
        cdef list groups = []
        while True:
            group = self._drain_one()
            if group is None:
                break
            groups.append(group)
        self._release_all(groups)
        return groups

    cdef int _release_all(self, list groups) except -1:
        return 0

    def pending_count(self):
        return self.assembling

    cdef Py_ssize_t _oldest(self) noexcept:
        cdef Py_ssize_t slot
        if self.assembling == 0:
            return -1
        while True:
            slot = self.fifo.slot[self.age_head]
            if self._valid(self.fifo, self.age_head) and self.g_state[slot] == ASSEMBLING:
                return slot
            self.age_head += 1

    def oldest_wait(self, now=None):
        cdef Py_ssize_t slot = self._oldest()
        if slot < 0:
            return 0.0
        cdef double t_now = self.clock() if now is None else now
        return max(0.0, t_now - self.g_created[slot])

    def waiting_for(self):
        """The parents the oldest incomplete group waits for (see the reference)."""
        cdef Py_ssize_t slot = self._oldest(), p
        if slot < 0:
            return []
        cdef uint64_t mask = self.g_mask[slot]
        return [self.names[p] for p in range(self.n)
                if not (mask >> p) & 1 and self._awaits(slot, p)]

    cdef bint _awaits(self, Py_ssize_t slot, Py_ssize_t p) noexcept:
        return True

    def has_pending_from(self, parent_name):
        return self.held[<Py_ssize_t>self.index[parent_name]] > 0

    def queue_lengths(self):
        """(creation-order entries, ready-queue entries) held, for memory-bound tests."""
        return self.fifo.n, self.ready.n

    cdef tuple _members(self, Py_ssize_t slot):
        cdef dict entries = {}
        cdef list handles = []
        cdef Py_ssize_t base = slot * self.n, p
        cdef uint64_t mask = self.g_mask[slot]
        cdef double event_ts = NAN, ts
        cdef int64_t seq = 0, s
        cdef bint first = True
        for p in range(self.n):
            if (mask >> p) & 1:
                entries[self.names[p]] = self.m_entry[base + p]
                handles.append(self.m_handle[base + p])
                ts = self.m_ts[base + p]
                if ts == ts and (event_ts != event_ts or ts < event_ts):
                    event_ts = ts
                s = self.m_seq[base + p]
                if first or s < seq:
                    seq = s
                    first = False
            else:
                entries[self.names[p]] = None
        return entries, handles, (None if event_ts != event_ts else event_ts), seq

    cdef object _emit(self, Py_ssize_t slot):
        raise NotImplementedError


cdef class TraceCore(_Core):
    """Groups by exact trace id; rules as in the reference core."""

    cdef dict by_trace

    def __init__(self, list parent_names, double timeout_s, Py_ssize_t quorum,
                 Py_ssize_t max_pending, bint missing_wait, object clock, object ready_factory,
                 object on_release=None):
        self._setup(parent_names, timeout_s, quorum, max_pending, missing_wait, clock,
                    ready_factory, on_release)
        self.by_trace = {}

    def add(self, parent_name, entry, handle):
        cdef Py_ssize_t p = self.index[parent_name]
        cdef Py_ssize_t target = -1, slot, i
        cdef uint64_t bit = (<uint64_t>1) << p
        cdef int64_t seq = _seq_of(entry)
        trace_id = entry.trace_id
        cdef list slots = self.by_trace.get(trace_id)
        if slots is not None:
            for o in slots:
                slot = o
                if self.g_mask[slot] & bit:
                    i = slot * self.n + p
                    if self.m_seq[i] == seq:
                        self._supersede(i, entry, handle)
                        self._hand_over()
                        return
                elif target < 0 and self.g_state[slot] == ASSEMBLING:
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
        self._join(target, p, NAN if ts is None else <double>ts, entry, handle, seq)
        if self.released:  # evicted over capacity
            self._hand_over()

    cdef int _forget(self, Py_ssize_t slot) except -1:
        cdef Py_ssize_t base = slot * self.n, p
        cdef uint64_t mask = self.g_mask[slot]
        trace_id = None
        for p in range(self.n):
            if (mask >> p) & 1:
                trace_id = self.m_entry[base + p].trace_id
                break
        cdef list slots = self.by_trace[trace_id]
        slots.remove(slot)
        if not slots:
            del self.by_trace[trace_id]
        return 0

    cdef object _emit(self, Py_ssize_t slot):
        entries, handles, event_ts, seq = self._members(slot)
        trace_id = None
        for e in (<dict>entries).values():
            if e is not None:
                trace_id = e.trace_id
                break
        self._forget(slot)
        self._release_slot(slot)
        return self.ready_factory(trace_id, seq, event_ts, entries, handles)


cdef class TimeCore(_Core):
    """Groups by event time with collect windows; rules as in the reference core."""

    cdef double tol, disorder, patience
    cdef double* g_time
    cdef double* g_completed
    cdef char* g_waiting
    cdef char* g_late
    cdef SortedTimes order, waiting
    cdef SlotQueue closing, late
    cdef Py_ssize_t late_head
    cdef double* wm
    cdef double* last
    cdef double* wm_sorted
    cdef double horizon, now_seen
    cdef list c_names
    cdef Py_ssize_t nc
    cdef dict c_index
    cdef double* c_window
    cdef double* c_wm
    cdef double* c_last
    cdef list c_buf
    cdef Py_ssize_t* c_live
    cdef Py_ssize_t* carry_from
    cdef list x_entry, x_handle, x_free
    cdef bytearray x_taken
    cdef list carry, carry_c
    cdef object collect_factory, epoch

    def __cinit__(self, *args, **kwargs):
        self.g_time = NULL
        self.g_completed = NULL
        self.g_waiting = NULL
        self.g_late = NULL
        self.wm = NULL
        self.last = NULL
        self.wm_sorted = NULL
        self.c_window = NULL
        self.c_wm = NULL
        self.c_last = NULL
        self.c_live = NULL
        self.carry_from = NULL

    def __dealloc__(self):
        PyMem_Free(self.g_time)
        PyMem_Free(self.g_completed)
        PyMem_Free(self.g_waiting)
        PyMem_Free(self.g_late)
        PyMem_Free(self.wm)
        PyMem_Free(self.last)
        PyMem_Free(self.wm_sorted)
        PyMem_Free(self.c_window)
        PyMem_Free(self.c_wm)
        PyMem_Free(self.c_last)
        PyMem_Free(self.c_live)
        PyMem_Free(self.carry_from)

    def __init__(self, list parent_names, list collect_names, list windows_s,
                 double tolerance_s, double timeout_s, Py_ssize_t quorum,
                 Py_ssize_t max_pending, bint missing_wait, object clock,
                 object ready_factory, object collect_factory, object epoch=None,
                 object on_release=None, double disorder_s=0.0):
        cdef Py_ssize_t i, m
        self._setup(parent_names, timeout_s, quorum, max_pending, missing_wait, clock,
                    ready_factory, on_release)
        self.epoch = time.time if epoch is None else epoch
        self.tol = tolerance_s
        self.disorder = disorder_s
        self.patience = tolerance_s + disorder_s  # see the reference
        self.order = SortedTimes()
        self.waiting = SortedTimes()
        self.closing = SlotQueue()
        self.late = SlotQueue()
        self.late_head = 0
        self.horizon = -INFINITY
        self.now_seen = -INFINITY
        self.c_names = list(collect_names)
        self.nc = len(self.c_names)
        self.c_index = {name: i for i, name in enumerate(self.c_names)}
        m = max(self.n, 1)
        self.wm = <double*>PyMem_Malloc(<size_t>m * sizeof(double))
        self.last = <double*>PyMem_Malloc(<size_t>m * sizeof(double))
        self.wm_sorted = <double*>PyMem_Malloc(<size_t>m * sizeof(double))
        m = max(self.nc, 1)
        self.c_window = <double*>PyMem_Malloc(<size_t>m * sizeof(double))
        self.c_wm = <double*>PyMem_Malloc(<size_t>m * sizeof(double))
        self.c_last = <double*>PyMem_Malloc(<size_t>m * sizeof(double))
        self.c_live = <Py_ssize_t*>PyMem_Malloc(<size_t>m * sizeof(Py_ssize_t))
        self.carry_from = <Py_ssize_t*>PyMem_Malloc(<size_t>m * sizeof(Py_ssize_t))
        if (self.wm == NULL or self.last == NULL or self.wm_sorted == NULL
                or self.c_window == NULL or self.c_wm == NULL or self.c_last == NULL
                or self.c_live == NULL or self.carry_from == NULL):
            raise MemoryError()
        for i in range(self.n):
            self.wm[i] = -INFINITY
            self.last[i] = -INFINITY
        for i in range(self.nc):
            self.c_window[i] = windows_s[i]
            self.c_wm[i] = -INFINITY
            self.c_last[i] = -INFINITY
            self.c_live[i] = 0
            self.carry_from[i] = 0
        self.c_buf = [SortedTimes() for _ in range(self.nc)]
        self.x_entry = []
        self.x_handle = []
        self.x_free = []
        self.x_taken = bytearray()
        self.carry = []
        self.carry_c = []
        self.collect_factory = collect_factory

    cdef int _grow_extra(self, Py_ssize_t cap) except -1:
        cdef Py_ssize_t c = self.g_cap
        grow_buffer(<void**>&self.g_time, &c, cap, sizeof(double))
        c = self.g_cap
        grow_buffer(<void**>&self.g_completed, &c, cap, sizeof(double))
        c = self.g_cap
        grow_buffer(<void**>&self.g_waiting, &c, cap, sizeof(char))
        c = self.g_cap
        grow_buffer(<void**>&self.g_late, &c, cap, sizeof(char))
        return 0

    cdef inline void _unwait(self, Py_ssize_t slot) noexcept:
        if self.g_waiting[slot]:
            self.g_waiting[slot] = 0
            self.waiting.remove(self.g_time[slot], slot)

    cdef int _stage(self, Py_ssize_t slot) except -1:
        self._unwait(slot)
        return _Core._stage(self, slot)

    cdef bint _given_up(self, Py_ssize_t slot, double now) noexcept:
        cdef double beyond = self.g_time[slot] + self.patience, created = self.g_created[slot]
        cdef double since
        cdef uint64_t mask = self.g_mask[slot]
        cdef Py_ssize_t p
        cdef bint silence = False
        for p in range(self.n):
            if (mask >> p) & 1 or self.wm[p] > beyond:
                continue
            since = self.last[p] if self.last[p] > -INFINITY else created
            if self.timeout < 0 or now < since + self.timeout:
                return False
            silence = True
        return not silence or self._windows_due(slot, now, created)

    cdef bint _windows_due(self, Py_ssize_t slot, double now, double unheard_since) noexcept:
        # Every collect window of the group could close now (see the reference).
        cdef double t = self.g_time[slot], since
        cdef Py_ssize_t c
        for c in range(self.nc):
            if self.c_wm[c] > t + self.c_window[c] + self.disorder:
                continue
            since = self.c_last[c] if self.c_last[c] > -INFINITY else unheard_since
            if self.timeout < 0 or now < since + self.timeout:
                return False
        return True

    cdef int _resolve(self, double now) except -1:
        cdef SortedTimes waiting = self.waiting
        cdef Py_ssize_t k, slot
        cdef list due = None
        for k in range(waiting.lo, waiting.n):
            slot = waiting.s[k]
            if slot < 0:
                continue
            if not self._given_up(slot, now):
                break
            if due is None:
                due = []
            due.append(slot)
        if due is None:
            return 0
        for slot in due:  # decided first: a discard edits the index being walked
            self._give_up(slot, "late" if self.g_late[slot] else "expired")
        return 0

    cdef int _give_up(self, Py_ssize_t slot, str reason) except -1:
        if self.g_count[slot] >= self.quorum:
            self._complete(slot)  # its collect windows still close on their own
        elif self.missing_wait:
            self._unwait(slot)
            self.g_expired[slot] = 1
        else:
            self._discard_group(slot, reason)
        return 0

    cdef int _expire_late(self, double now) except -1:
        # The late groups past their deadline, oldest first (see the reference).
        cdef SlotQueue late = self.late
        cdef Py_ssize_t slot
        while self.late_head < late.n:
            slot = late.slot[self.late_head]
            if (self._valid(late, self.late_head) and self.g_state[slot] == ASSEMBLING
                    and not self.g_expired[slot]):
                if now < self.g_created[slot] + self.timeout:
                    break
                self._give_up(slot, "late")
            self.late_head += 1
        if self.late_head > COMPACT_SLACK and self.late_head * 2 > late.n:
            late.drop_prefix(self.late_head)
            self.late_head = 0
        return 0

    cdef int _sweep(self, double now) except -1:
        self.now_seen = now
        self._expire_late(now)
        self._resolve(now)
        self._promote(now)  # a group just resolved may find its windows closed already
        self._compact_fifo()
        self._sweep_extra(now)
        return 0

    def heard(self, parent_name, now=None):
        cdef double t_now = self.clock() if now is None else now
        self.now_seen = t_now
        c = self.c_index.get(parent_name)
        if c is not None:
            self.c_last[<Py_ssize_t>c] = t_now
            return
        po = self.index.get(parent_name)
        if po is None:
            raise KeyError(parent_name)
        self.last[<Py_ssize_t>po] = t_now

    cdef bint _awaits(self, Py_ssize_t slot, Py_ssize_t p) noexcept:
        return (self.g_expired[slot] or (self.g_late[slot] and self.timeout >= 0)
                or self.wm[p] <= self.g_time[slot] + self.patience)

    def watermarks(self):
        """Each parent's watermark, None before its first message (see the reference)."""
        cdef Py_ssize_t i
        marks = {}
        for i in range(self.n):
            marks[self.names[i]] = None if self.wm[i] == -INFINITY else self.wm[i]
        for i in range(self.nc):
            marks[self.c_names[i]] = None if self.c_wm[i] == -INFINITY else self.c_wm[i]
        return marks

    def has_pending_from(self, parent_name):
        c = self.c_index.get(parent_name)
        if c is not None:
            return self.c_live[<Py_ssize_t>c] > 0 or self.carry_from[<Py_ssize_t>c] > 0
        return self.held[<Py_ssize_t>self.index[parent_name]] > 0

    cdef void _update_horizon(self) noexcept:
        # quorum-th lowest watermark: insertion sort of at most 64 doubles
        cdef Py_ssize_t i, j
        cdef double v
        for i in range(self.n):
            v = self.wm[i]
            j = i
            while j > 0 and self.wm_sorted[j - 1] > v:
                self.wm_sorted[j] = self.wm_sorted[j - 1]
                j -= 1
            self.wm_sorted[j] = v
        self.horizon = self.wm_sorted[self.quorum - 1]

    def add(self, parent_name, entry, handle):
        cdef object po = self.index.get(parent_name)
        if po is None:
            co = self.c_index.get(parent_name)
            if co is None:
                raise KeyError(parent_name)
            self._add_sample(co, entry, handle)
            if self.released:
                self._hand_over()
            return
        cdef Py_ssize_t p = po
        cdef double now = self.now_seen  # no clock call per message: see the reference
        cdef double ts = _event_time(entry, self.epoch)
        cdef int64_t seq = _seq_of(entry)
        cdef SortedTimes order = self.order
        cdef double tol = self.tol, d, best_d = 0.0
        cdef uint64_t bit = (<uint64_t>1) << p
        cdef Py_ssize_t best = -1, i, j, k, slot, m, head
        cdef SortedTimes waiting = self.waiting
        cdef bint advanced = ts > self.wm[p], late = ts < self.wm[p] - self.disorder
        if advanced:
            self.wm[p] = ts
            if self.nc:
                self._update_horizon()
        i = lower_bound(order.t, order.lo, order.n, ts - tol)
        j = upper_bound(order.t, order.lo, order.n, ts + tol)
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
            elif self.g_state[slot] == ASSEMBLING:
                d = fabs(order.t[k] - ts)
                if d <= tol and (best < 0 or d < best_d):
                    best = slot
                    best_d = d
        if best < 0:
            now = self.clock()
            self.now_seen = now
            best = self._alloc(now)
            self.g_time[best] = ts
            order.insert(ts, best)
            self.g_late[best] = late
            if late and self.timeout >= 0:
                self.late.push(best, self.g_serial[best])  # its deadline decides it
                self.g_waiting[best] = 0  # stale on a reused slot, unset on a new one
            else:
                self.waiting.insert(ts, best)
                self.g_waiting[best] = 1
            self._evict_over_capacity()
        self.last[p] = now
        self._join(best, p, ts, entry, handle, seq)
        if advanced and waiting.lo < waiting.n:
            # Only the oldest waiting group can be resolved first, and p's watermark
            # moved: worth a scan only when that group lacks p and p has passed it.
            # (What silence resolves meanwhile, the next sweep does.)
            head = waiting.s[waiting.lo]
            if not ((self.g_mask[head] >> p) & 1) and ts > self.g_time[head] + self.patience:
                self._resolve(now)
        if self.released:  # evicted over capacity, or given up by the watermark
            self._hand_over()

    cdef int _complete(self, Py_ssize_t slot) except -1:
        if self.nc == 0:
            return self._stage(slot)
        self._unwait(slot)
        self.assembling -= 1
        self.g_state[slot] = CLOSING
        self.g_completed[slot] = self.clock()
        self.closing.push(slot, self.g_serial[slot])
        return 0

    cdef int _forget(self, Py_ssize_t slot) except -1:
        self._unwait(slot)
        self.order.remove(self.g_time[slot], slot)
        return 0

    cdef int _promote(self, double now) except -1:
        cdef Py_ssize_t k, keep = 0, slot
        if self.closing.n == 0:
            return 0
        for k in range(self.closing.n):
            if not self._valid(self.closing, k):
                continue
            slot = self.closing.slot[k]
            if self.g_state[slot] != CLOSING:
                continue
            if self._windows_due(slot, now, self.g_completed[slot]):
                self._stage(slot)
            else:
                self.closing.slot[keep] = slot
                self.closing.serial[keep] = self.closing.serial[k]
                keep += 1
        self.closing.n = keep
        return 0

    # -- collect samples ---------------------------------------------------------

    cdef bint _covered(self, double s, double w) noexcept:
        cdef SortedTimes order = self.order
        cdef Py_ssize_t i = lower_bound(order.t, order.lo, order.n, s - w)
        cdef Py_ssize_t j = upper_bound(order.t, order.lo, order.n, s + w), k
        for k in range(i, j):
            if order.s[k] >= 0 and fabs(order.t[k] - s) <= w:
                return True
        return False

    cdef inline bint _settled(self, double s, double w) noexcept:
        return s + w < self.horizon - self.patience and not self._covered(s, w)

    cdef int _add_sample(self, Py_ssize_t c, object entry, object handle) except -1:
        self.c_last[c] = self.clock()
        cdef double ts = _event_time(entry, self.epoch)
        cdef SortedTimes buf = <SortedTimes>self.c_buf[c]
        cdef Py_ssize_t i, j, k, x
        if ts > self.c_wm[c]:
            self.c_wm[c] = ts
        i = lower_bound(buf.t, buf.lo, buf.n, ts)
        j = upper_bound(buf.t, buf.lo, buf.n, ts)
        for k in range(i, j):
            x = buf.s[k]
            if x >= 0:
                old = self.x_entry[x]
                if old.seq == entry.seq and old.trace_id == entry.trace_id:
                    old_handle = self.x_handle[x]
                    self.x_entry[x] = entry
                    self.x_handle[x] = handle
                    self.released.append((old_handle, SUPERSEDED))
                    return 0
        if self._settled(ts, self.c_window[c]):
            self.released.append((handle, "expired"))
            return 0
        if self.x_free:
            x = self.x_free.pop()
            self.x_entry[x] = entry
            self.x_handle[x] = handle
            self.x_taken[x] = 0
        else:
            x = len(self.x_entry)
            self.x_entry.append(entry)
            self.x_handle.append(handle)
            self.x_taken.append(0)
        buf.insert(ts, x)
        self.c_live[c] += 1
        if self.c_live[c] > self.max_pending:
            k = buf.lo
            self._drop_sample(c, buf.t[k], buf.s[k], "evicted")
        return 0

    cdef int _drop_sample(self, Py_ssize_t c, double ts, Py_ssize_t x, str reason) except -1:
        (<SortedTimes>self.c_buf[c]).remove(ts, x)
        self.c_live[c] -= 1
        handle = self.x_handle[x]
        cdef bint taken = self.x_taken[x]
        self.x_entry[x] = None
        self.x_handle[x] = None
        self.x_free.append(x)
        if taken:
            self.carry.append(handle)
            self.carry_c.append(c)
            self.carry_from[c] += 1
        else:
            self.released.append((handle, reason))
        return 0

    cdef int _settle(self) except -1:
        cdef Py_ssize_t c, k
        cdef SortedTimes buf
        cdef double w
        for c in range(self.nc):
            buf = <SortedTimes>self.c_buf[c]
            w = self.c_window[c]
            while buf.lo < buf.n:
                k = buf.lo
                if not self._settled(buf.t[k], w):
                    break
                self._drop_sample(c, buf.t[k], buf.s[k], "expired")
        return 0

    cdef int _sweep_extra(self, double now) except -1:
        if self.nc:
            self._settle()
        return 0

    cdef list _flush(self, double now):
        cdef double horizon = self.horizon
        cdef Py_ssize_t k
        # Complete groups still waiting on a window go first, windows closed as they stand.
        for k in range(self.closing.n):
            if self._valid(self.closing, k) and self.g_state[self.closing.slot[k]] == CLOSING:
                self._stage(self.closing.slot[k])
        self.closing.n = 0
        # No group can follow the end of input, so every sample settles once the
        # groups that cover it are out.
        self.horizon = INFINITY
        try:
            return _Core._flush(self, now)
        finally:
            self.horizon = horizon

    cdef int _release_all(self, list groups) except -1:
        cdef Py_ssize_t c, k
        cdef SortedTimes buf
        for c in range(self.nc):
            buf = <SortedTimes>self.c_buf[c]
            while buf.lo < buf.n:
                k = buf.lo
                self._drop_sample(c, buf.t[k], buf.s[k], "flushed")
        if self.carry:
            if groups:
                handles = groups[len(groups) - 1].handles
                for k in range(len(self.carry)):
                    handles.append(self.carry[k])
                    self.carry_from[<Py_ssize_t>self.carry_c[k]] -= 1
            else:
                for k in range(len(self.carry)):
                    self.carry_from[<Py_ssize_t>self.carry_c[k]] -= 1
                    self.released.append((self.carry[k], "flushed"))
            self.carry = []
            self.carry_c = []
        return 0

    cdef object _emit(self, Py_ssize_t slot):
        cdef dict entries
        cdef list handles, keys = [], messages, metadata, times, settled
        cdef Py_ssize_t base = slot * self.n, p, c, i, j, k, x
        cdef uint64_t mask = self.g_mask[slot]
        cdef double t = self.g_time[slot], w, s
        cdef SortedTimes buf
        entries, handles, event_ts, seq = self._members(slot)
        for p in range(self.n):
            if (mask >> p) & 1:
                e = self.m_entry[base + p]
                keys.append(f"{self.names[p]}\x00{e.trace_id}\x00{self.m_seq[base + p]}\x00")
        self._forget(slot)
        self._release_slot(slot)
        for c in range(self.nc):
            w = self.c_window[c]
            buf = <SortedTimes>self.c_buf[c]
            messages = []
            metadata = []
            times = []
            settled = []
            i = lower_bound(buf.t, buf.lo, buf.n, t - w)
            j = upper_bound(buf.t, buf.lo, buf.n, t + w)
            for k in range(i, j):
                x = buf.s[k]
                if x < 0:
                    continue
                s = buf.t[k]
                if fabs(s - t) > w:
                    continue
                e = self.x_entry[x]
                messages.append(e.message)
                metadata.append(e.metadata)
                times.append(s)
                self.x_taken[x] = 1
                if self._settled(s, w):
                    settled.append((s, x))
            for s, x in settled:
                self._drop_sample(c, s, x, "expired")
            entries[self.c_names[c]] = self.collect_factory(messages, metadata, times)
        if self.carry:
            for k in range(len(self.carry)):
                handles.append(self.carry[k])
                self.carry_from[<Py_ssize_t>self.carry_c[k]] -= 1
            self.carry = []
            self.carry_c = []
        return self.ready_factory(group_identity(keys), seq, event_ts, entries, handles)
