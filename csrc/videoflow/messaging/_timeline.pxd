"""Declarations shared by the compiled grouping modules."""

from libc.stdint cimport int64_t

cdef enum:
    COMPACT_SLACK = 32


cdef int grow_buffer(void** ptr, Py_ssize_t* cap, Py_ssize_t need, size_t item) except -1


cdef inline Py_ssize_t lower_bound(const double* t, Py_ssize_t lo, Py_ssize_t hi, double a) noexcept nogil:
    """First index in [lo, hi) whose time is >= a (hi when none)."""
    cdef Py_ssize_t mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if t[mid] < a:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef inline Py_ssize_t upper_bound(const double* t, Py_ssize_t lo, Py_ssize_t hi, double b) noexcept nogil:
    """First index in [lo, hi) whose time is > b (hi when none)."""
    cdef Py_ssize_t mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if b < t[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


cdef class SortedTimes:
    cdef object t_arr, s_arr
    cdef double* t
    cdef int64_t* s
    cdef Py_ssize_t cap, n, lo, dead
    cdef int _reserve(self, Py_ssize_t cap) except -1
    cdef Py_ssize_t lower(self, double a) noexcept
    cdef Py_ssize_t upper(self, double b) noexcept
    cdef int insert(self, double t, int64_t slot) except -1
    cdef void remove(self, double t, int64_t slot) noexcept
    cdef void _trim(self) noexcept


cdef class SlotQueue:
    cdef int64_t* slot
    cdef int64_t* serial
    cdef Py_ssize_t cap, n
    cdef int push(self, int64_t slot, int64_t serial) except -1
    cdef void drop_prefix(self, Py_ssize_t k) noexcept
