"""Hand the C heap's free pages back to the operating system: what a process that runs for days does after each
large, repeated piece of work.

    release_free_heap()     # after a weight update, after a training step; seconds it took, None off glibc

glibc's malloc keeps memory a program freed for the next allocation instead of returning it. Its heap only shrinks
from the top, and blocks it first served by their own mapping move to the heap once a large one was freed (the
mapping threshold adapts upward). A process that allocates tensors of changing sizes over and over, for hours, then
holds a growing share of free pages in its resident memory, and a soak cannot tell that from a leak. `malloc_trim(0)`
gives every whole free page back (inside the heap too, not only at its top), so resident memory follows what is in
use. `docs/reliability.md` (memory over hours) says where sr1 calls it and what it changed.

It takes milliseconds for a heap of a few hundred MiB. Elsewhere than glibc (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time


def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:  # pragma: no cover - no C library to load
        return None
    trim = getattr(libc, "malloc_trim", None)  # glibc only
    if trim is not None:
        trim.argtypes = [ctypes.c_size_t]
        trim.restype = ctypes.c_int
    return trim


_MALLOC_TRIM = _malloc_trim()


def release_free_heap() -> float | None:
    """Return the heap's free pages to the operating system (glibc's `malloc_trim(0)`); the seconds it took, or
    None where the C library has no `malloc_trim`."""
    if _MALLOC_TRIM is None:
        return None
    start = time.perf_counter()
    _MALLOC_TRIM(0)
    return time.perf_counter() - start
