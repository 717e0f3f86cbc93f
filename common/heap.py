"""Hand the C heap's free pages back to the operating system: what a process that runs for days does after each
large, repeated piece of work.

    release_free_heap()     # after a weight update, after a training step; seconds it took, None off glibc
    heap_usage()            # {"in_use_mib": ..., "free_mib": ...} of malloc's arenas (glibc 2.33+), else None

glibc's malloc keeps memory a program freed for the next allocation instead of returning it. Its heap only shrinks
from the top, and blocks it first served by their own mapping move to the heap once a large one was freed (the
mapping threshold adapts upward). A process that allocates tensors of changing sizes over and over, for hours, then
holds a growing share of free pages in its resident memory, and a soak cannot tell that from a leak. `malloc_trim(0)`
gives every whole free page back (inside the heap too, not only at its top), so resident memory follows what is in
use. `docs/measurements/memory-over-hours.md` says where sr1 calls it and what it changed.

It takes milliseconds for a heap of a few hundred MiB. Elsewhere than glibc (musl, macOS) it does nothing.
Setting `SR1_KEEP_FREED_HEAP=1` in a process's environment turns it off there (and in the processes it starts), to
compare with glibc's own behaviour: `scripts/bench/worker_memory.py --keep-freed-heap` does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time

KEEP_FREED_ENV = "SR1_KEEP_FREED_HEAP"
_MALLINFO2_FIELDS = (
    "arena",
    "ordblks",
    "smblks",
    "hblks",
    "hblkhd",
    "usmblks",
    "fsmblks",
    "uordblks",
    "fordblks",
    "keepcost",
)


class _MallInfo2(ctypes.Structure):
    """glibc's `struct mallinfo2` (every field a size_t)."""

    _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO2_FIELDS]


def _libc_functions():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:  # pragma: no cover - no C library to load
        return None, None
    trim = getattr(libc, "malloc_trim", None)  # glibc only
    if trim is not None:
        trim.argtypes = [ctypes.c_size_t]
        trim.restype = ctypes.c_int
    info = getattr(libc, "mallinfo2", None)  # glibc 2.33 and later
    if info is not None:
        info.argtypes = []
        info.restype = _MallInfo2
    return trim, info


_MALLOC_TRIM, _MALLINFO2 = _libc_functions()


def release_free_heap() -> float | None:
    """Return the heap's free pages to the operating system (glibc's `malloc_trim(0)`); the seconds it took, or
    None where the C library has no `malloc_trim` (or `SR1_KEEP_FREED_HEAP` is set)."""
    if _MALLOC_TRIM is None or os.environ.get(KEEP_FREED_ENV):
        return None
    start = time.perf_counter()
    _MALLOC_TRIM(0)
    return time.perf_counter() - start


def heap_usage() -> dict[str, float] | None:
    """What malloc holds in this process, in MiB: `in_use_mib` (allocated and not freed, every arena and mapping) and
    `free_mib` (freed, kept by malloc for reuse); None without glibc's `mallinfo2`."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    mib = 1 / 2**20
    return {"in_use_mib": (info.uordblks + info.hblkhd) * mib, "free_mib": info.fordblks * mib}
