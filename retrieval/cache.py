"""The server's (query, topk) -> Hits cache: least recently used first out, bounded by entries and by bytes.

    cache = ResultCache(max_entries=100_000, max_bytes=256 << 20)
    cache.put(("who wrote hamlet", 3), hits); cache.get(("who wrote hamlet", 3))  # -> hits (now most recent)

Each entry holds its own copies of the documents (the store reads fresh dicts per search), so an entry's size is
its passages' size: a few KB with Search-R1's top-3 wiki passages, ten times that with reranking candidates. A count
alone cannot bound that memory (100,000 entries could be 2 GB per worker), so the cache also counts bytes:
`entry_bytes` adds up what the entry's Python objects hold (`sys.getsizeof` of the query, each document dict, its
keys and values, the lists and the scores), and the least recently used entries go until both bounds hold.
`docs/retrieval.md` compares the estimate with what tracemalloc measures.
"""

from __future__ import annotations

import sys
from collections import OrderedDict

from retrieval.base import Hits

_FLOAT_BYTES = sys.getsizeof(1.0)


def entry_bytes(key: tuple[str, int], hits: Hits) -> int:
    """What one cached entry holds in memory, estimated from its objects' sizes (keys counted once per document:
    an overestimate where they are shared strings)."""
    size = sys.getsizeof(key) + sys.getsizeof(key[0]) + sys.getsizeof(hits)
    size += sys.getsizeof(hits.docs) + sys.getsizeof(hits.scores) + _FLOAT_BYTES * len(hits.scores)
    for doc in hits.docs:
        size += sys.getsizeof(doc) + sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in doc.items())
    return size


class ResultCache:
    """An LRU map of (query, topk) -> Hits under `max_entries` and `max_bytes` (either 0 disables the cache). An
    entry larger than `max_bytes` on its own is not kept."""

    def __init__(self, max_entries: int, max_bytes: int):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._data: OrderedDict[tuple[str, int], tuple[Hits, int]] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.max_bytes > 0

    def get(self, key: tuple[str, int]) -> Hits | None:
        if not self.enabled:
            return None
        found = self._data.get(key)
        if found is None:
            self.misses += 1
            return None
        self._data.move_to_end(key)
        self.hits += 1
        return found[0]

    def put(self, key: tuple[str, int], value: Hits) -> None:
        if not self.enabled:
            return
        size = entry_bytes(key, value)
        if size > self.max_bytes:
            return
        old = self._data.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self._data[key] = (value, size)
        self.bytes += size
        while len(self._data) > self.max_entries or self.bytes > self.max_bytes:
            _, (_, evicted) = self._data.popitem(last=False)
            self.bytes -= evicted

    def __len__(self) -> int:
        return len(self._data)
