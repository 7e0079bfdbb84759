"""Freed memory stays in the process on Linux, so that the next decode step does not fault it in again.

glibc's malloc hands large freed blocks back to the kernel (munmap, and a trim
of the heap's top), and the next allocation of the same size maps fresh pages,
each zeroed by the kernel on first touch. A decode step of a 0.5B model with a
152k vocabulary allocates and frees tens of megabytes of logits, noise and
activations, so that cost came back every step: a third of a step's CPU time
was system time (a Qwen2.5-0.5B OCaml step: 105 s of 457 CPU seconds), and the
sampler's own work over (32, 151936) logits took 84 ms against 26 ms with freed
memory kept (docs/performance.md). Blocks up to 32 MB (glibc's largest mmap
threshold) are then served from the heap, and up to 2 GB of freed heap stays
mapped for reuse; the peak is unchanged, since that memory was in use just before.

Blocks above 32 MB are still mapped fresh by default, and a wide decode makes
many: at 256 rows one step's logits are 155 MB, and each layer's key buffer
75 MB. So glibc is also told never to map a block on its own (M_MMAP_MAX 0):
every block comes from the heap. Measured on a 0.5B model (docs/performance.md):
a greedy decode step at 256 rows 4.3 s -> 3.0 s, an eval of 64 problems 11%
faster with three quarters of its page faults gone, for about 0.6 GB more
resident memory.

mallopt takes effect at once for later allocations. A value the user set
through glibc's own environment variables (MALLOC_MMAP_THRESHOLD_,
MALLOC_MMAP_MAX_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_) is left alone, and
nothing happens off glibc.
"""

from __future__ import annotations

import ctypes
import os
import sys

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -2, -3, -4
_SETTINGS = (
    (_M_MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_", 32 << 20),
    (_M_MMAP_MAX, "MALLOC_MMAP_MAX_", 0),
    (_M_TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", (1 << 31) - 1),
    (_M_TOP_PAD, "MALLOC_TOP_PAD_", 64 << 20),
)
_done = False


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed blocks for reuse (see the module docstring); True when it did."""
    global _done
    if _done or not sys.platform.startswith("linux"):
        return _done
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries: nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    for parameter, variable, value in _SETTINGS:
        if variable not in os.environ:
            mallopt(parameter, value)
    _done = True
    return True
