"""The result cache is bounded by bytes as well as entries, least recently used out first, and its estimate of an
entry's bytes is close to what tracemalloc measures (retrieval/cache.py)."""

from __future__ import annotations

import tracemalloc

from aiohttp.test_utils import TestClient, TestServer

from retrieval.base import Hits, LocalRetriever
from retrieval.cache import ResultCache, entry_bytes
from retrieval.server import create_app
from retrieval.settings import RetrievalConfig


def _hits(n_docs: int, chars: int, tag: str = "") -> Hits:
    docs = [{"id": f"{tag}{i}", "contents": f"{tag}{i}:" + "x" * chars} for i in range(n_docs)]
    return Hits(docs, [1.0] * n_docs)


def test_the_cache_keeps_within_its_bytes_evicting_the_least_recently_used():
    entry = entry_bytes(("q0", 3), _hits(3, 4000, "q0"))
    cache = ResultCache(max_entries=1000, max_bytes=int(entry * 4.5))  # room for four entries, not five
    for i in range(4):
        cache.put((f"q{i}", 3), _hits(3, 4000, f"q{i}"))
    assert len(cache) == 4 and cache.bytes <= cache.max_bytes
    assert cache.get(("q0", 3)) is not None  # q0 used: q1 is now the least recent
    cache.put(("q4", 3), _hits(3, 4000, "q4"))
    assert len(cache) == 4 and cache.bytes <= cache.max_bytes
    assert cache.get(("q1", 3)) is None and cache.get(("q0", 3)) is not None
    cache.put(
        ("huge", 3), _hits(3, 10 * entry, "huge")
    )  # larger than the whole cache: not kept, nothing evicted
    assert cache.get(("huge", 3)) is None and len(cache) == 4
    cache.put(("q0", 3), _hits(1, 10, "q0"))  # replaced: its bytes are the new entry's
    assert cache.bytes == sum(
        entry_bytes(k, cache.get(k)) for k in [("q0", 3), ("q2", 3), ("q3", 3), ("q4", 3)]
    )


def test_the_estimate_is_close_to_what_the_entries_really_hold():
    cache = ResultCache(max_entries=10_000, max_bytes=1 << 40)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(500):
        # fresh strings per entry, as DocStore.get_many decodes them per search
        cache.put((f"who founded entity {i}?", 3), _hits(3, 600, f"e{i}-"))
    measured = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert 0.9 <= cache.bytes / measured <= 1.5, (cache.bytes, measured)


class BigRetriever(LocalRetriever):
    """Each result holds `topk` passages of 20,000 characters."""

    name = "big"

    def search(self, queries, topk):
        return [_hits(topk, 20_000, q) for q in queries]


async def test_the_server_cache_holds_no_more_than_cache_mb():
    cfg = RetrievalConfig(server={"cache_size": 100_000, "cache_mb": 1})
    client = TestClient(TestServer(create_app(BigRetriever(), cfg)))
    await client.start_server()
    try:
        for i in range(40):  # ~60 KB each: 2.4 MB if the entry count were the only bound
            assert (await client.post("/retrieve", json={"queries": [f"q{i}"], "topk": 3})).status == 200
        metrics = await (await client.get("/metrics")).json()
        assert metrics["retrieval/cache_mb"] <= 1.0 and 10 <= metrics["retrieval/cache_entries"] < 40
    finally:
        await client.close()
