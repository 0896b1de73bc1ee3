# cython: language_level=3
"""Sorted event-time storage for the compiled grouping core.

Kernels over sorted float64 arrays (binary search, window bounds) and the two
containers the cores build on: ``SortedTimes`` (times in a numpy array with a
parallel slot array, a head offset and tombstones) and ``SlotQueue`` (an
append-only sequence of (slot, serial) with consumer heads). The kernels trust
their input: callers keep the arrays sorted.
"""

from cpython.mem cimport PyMem_Free, PyMem_Realloc
from libc.stdint cimport int64_t
from libc.string cimport memcpy, memmove

import numpy as np


cdef int grow_buffer(void** ptr, Py_ssize_t* cap, Py_ssize_t need, size_t item) except -1:
    """Grows a PyMem buffer to hold at least need items (doubling)."""
    cdef Py_ssize_t new_cap = cap[0] if cap[0] > 0 else 16
    cdef void* p
    if need <= cap[0]:
        return 0
    while new_cap < need:
        new_cap *= 2
    p = PyMem_Realloc(ptr[0], <size_t>new_cap * item)
    if p == NULL:
        raise MemoryError()
    ptr[0] = p
    cap[0] = new_cap
    return 0


def search_window(const double[::1] times, double a, double b):
    """Index range [i, j) of the entries of a sorted time array with a <= t <= b.

    The kernel trusts its input: times must be sorted ascending (NaN-free). Read-only
    arrays (made from received bytes) are accepted.

    Returns:
        (i, j), with i == j when nothing falls in the window.
    """
    cdef Py_ssize_t n = times.shape[0]
    if n == 0:
        return 0, 0
    return lower_bound(&times[0], 0, n, a), upper_bound(&times[0], 0, n, b)


cdef class SortedTimes:
    """Event times kept sorted in a numpy float64 array, each tagged with a slot in a
    parallel int64 array; removal leaves a tombstone (slot -1). A head offset makes
    removing the oldest free of moves; tombstones are compacted once they outnumber
    the live entries."""


    def __cinit__(self):
        self.cap = 0
        self.n = 0
        self.lo = 0
        self.dead = 0
        self._reserve(16)

    cdef int _reserve(self, Py_ssize_t cap) except -1:
        t_arr = np.empty(cap, dtype=np.float64)
        s_arr = np.empty(cap, dtype=np.int64)
        cdef double[::1] tv = t_arr
        cdef int64_t[::1] sv = s_arr
        if self.n:
            memcpy(&tv[0], self.t, <size_t>self.n * sizeof(double))
            memcpy(&sv[0], self.s, <size_t>self.n * sizeof(int64_t))
        # The arrays own the memory; the raw pointers are the hot loops' view of it.
        self.t_arr = t_arr
        self.s_arr = s_arr
        self.t = &tv[0]
        self.s = &sv[0]
        self.cap = cap
        return 0

    cdef Py_ssize_t lower(self, double a) noexcept:
        return lower_bound(self.t, self.lo, self.n, a)

    cdef Py_ssize_t upper(self, double b) noexcept:
        return upper_bound(self.t, self.lo, self.n, b)

    cdef int insert(self, double t, int64_t slot) except -1:
        cdef Py_ssize_t i = self.upper(t)
        if self.n == self.cap:
            self._reserve(2 * self.cap)
        if i < self.n:
            memmove(&self.t[i + 1], &self.t[i], <size_t>(self.n - i) * sizeof(double))
            memmove(&self.s[i + 1], &self.s[i], <size_t>(self.n - i) * sizeof(int64_t))
        self.t[i] = t
        self.s[i] = slot
        self.n += 1
        return 0

    cdef void remove(self, double t, int64_t slot) noexcept:
        cdef Py_ssize_t i = self.lower(t)
        while self.s[i] != slot:
            i += 1
        self.s[i] = -1
        self.dead += 1
        self._trim()

    cdef void _trim(self) noexcept:
        cdef Py_ssize_t i, j, live
        while self.lo < self.n and self.s[self.lo] == -1:
            self.lo += 1
            self.dead -= 1
        while self.n > self.lo and self.s[self.n - 1] == -1:
            self.n -= 1
            self.dead -= 1
        live = self.n - self.lo - self.dead
        if self.dead > live + COMPACT_SLACK:
            j = 0
            for i in range(self.lo, self.n):
                if self.s[i] != -1:
                    self.t[j] = self.t[i]
                    self.s[j] = self.s[i]
                    j += 1
            self.n = j
            self.lo = 0
            self.dead = 0
        elif self.lo > COMPACT_SLACK and self.lo * 2 > self.n:
            memmove(self.t, &self.t[self.lo], <size_t>(self.n - self.lo) * sizeof(double))
            memmove(self.s, &self.s[self.lo], <size_t>(self.n - self.lo) * sizeof(int64_t))
            self.n -= self.lo
            self.lo = 0

    # Python-level access, for tests against a brute-force oracle.

    def py_insert(self, double t, int64_t slot):
        self.insert(t, slot)

    def py_remove(self, double t, int64_t slot):
        self.remove(t, slot)

    def py_bounds(self, double a, double b):
        return self.lower(a), self.upper(b)

    def live(self):
        """(times, slots) of the live entries, in order, as numpy arrays."""
        t = self.t_arr[self.lo:self.n]
        s = self.s_arr[self.lo:self.n]
        keep = s >= 0
        return t[keep].copy(), s[keep].copy()


cdef class SlotQueue:
    """Append-only (slot, serial) sequence with consumer heads; compacted in place."""


    def __cinit__(self):
        self.slot = NULL
        self.serial = NULL
        self.cap = 0
        self.n = 0

    def __dealloc__(self):
        PyMem_Free(self.slot)
        PyMem_Free(self.serial)

    cdef int push(self, int64_t slot, int64_t serial) except -1:
        cdef Py_ssize_t cap = self.cap
        if self.n + 1 > cap:
            grow_buffer(<void**>&self.slot, &cap, self.n + 1, sizeof(int64_t))
            cap = self.cap
            grow_buffer(<void**>&self.serial, &cap, self.n + 1, sizeof(int64_t))
            self.cap = cap
        self.slot[self.n] = slot
        self.serial[self.n] = serial
        self.n += 1
        return 0

    cdef void drop_prefix(self, Py_ssize_t k) noexcept:
        memmove(self.slot, &self.slot[k], <size_t>(self.n - k) * sizeof(int64_t))
        memmove(self.serial, &self.serial[k], <size_t>(self.n - k) * sizeof(int64_t))
        self.n -= k
