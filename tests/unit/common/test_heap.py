"""`release_free_heap` gives freed heap pages back: resident memory falls to what is still in use."""

from __future__ import annotations

import subprocess
import sys

import pytest

from common import heap

pytestmark = pytest.mark.skipif(
    heap._MALLOC_TRIM is None, reason="the C library has no malloc_trim (not glibc)"
)

# In a fresh interpreter (this process's heap and mapping threshold are whatever earlier tests left): 200 MB of
# 100 KB blocks, served by the heap (under glibc's first mapping threshold, 128 KiB), then freed while one block
# allocated after them keeps the heap's top in use, so glibc cannot shrink the heap by itself.
_CHILD = """
import psutil
from common.heap import release_free_heap
rss = lambda: psutil.Process().memory_info().rss / 2**20
base = rss()
blocks = [bytes(100_000) for _ in range(2000)]
top = bytes(100_000)
held = rss()
del blocks
freed = rss()
took = release_free_heap()
print(base, held, freed, rss(), took)
"""


def test_freed_heap_pages_go_back_to_the_system_only_when_released():
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True, timeout=60
    )
    base, held, freed, released, took = map(float, out.stdout.split())
    assert held - base > 100, f"the blocks were not resident: {base:.0f} -> {held:.0f} MiB"
    assert freed > held - 20, f"glibc returned the freed blocks by itself ({held:.0f} -> {freed:.0f} MiB)"
    assert released < base + 0.2 * (freed - base), (
        f"release_free_heap kept most of the freed pages: {freed:.0f} -> {released:.0f} MiB (before them: {base:.0f})"
    )
    assert took >= 0
