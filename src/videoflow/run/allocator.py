"""How a replica process's C allocator treats frame-sized buffers.

glibc serves an allocation above its mmap threshold with a mapping of its own, and
gives the free memory at the top of its heap back to the kernel past its trim
threshold. Its defaults (128 KiB, rising only to the largest chunk freed; twice that
for trimming) suit a process that allocates a large buffer now and then. A node that
builds, encodes and writes a 2-6 MB frame 30 times a second is the other case: every
buffer of every frame comes back from the kernel, a page fault per 4 KiB with the page
zeroed, and goes back to it when freed. Measured in the demo's cameras (4 x 30 fps,
1920x1080): 730 minor faults per frame, half of each camera's CPU time in the kernel,
on a host whose two cores the flow kept busy.

tune_allocator raises both thresholds once, at the start of a replica process, so
frame buffers are reused from the heap. It does nothing where the C library is not
glibc, and nothing when the user has tuned the allocator through the environment
(MALLOC_*_ variables, GLIBC_TUNABLES): theirs stands.
"""

from __future__ import annotations

import ctypes
import os
import platform
from typing import Final

__all__ = ["MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "tune_allocator"]

MMAP_THRESHOLD_BYTES: Final = 32 << 20
"""Allocations up to this size come from the heap, where freed ones are reused: a
3-channel 4K frame is 24 MiB. glibc's own dynamic threshold stops at the same value."""

TRIM_THRESHOLD_BYTES: Final = 64 << 20
"""How much free memory a process keeps at the top of its heap before returning it:
room for a few frames in flight and their encodings, a bounded cost per process."""

_M_TRIM_THRESHOLD: Final = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD: Final = -3
_USER_TUNING: Final = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                       "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_", "GLIBC_TUNABLES")


def tune_allocator() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (see the module).

    Returns:
        whether they were set: False off glibc, when the environment tunes the
        allocator already, or when glibc refused a value.
    """
    if platform.libc_ver()[0] != "glibc" or any(os.environ.get(n) for n in _USER_TUNING):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no C library to ask
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mallopt returns 1 on success, 0 on a value it refused.
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
