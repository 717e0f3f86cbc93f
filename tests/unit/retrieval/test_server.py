"""The server's API shape, limits, batching and cache, in-process (aiohttp test server on loopback)."""

import asyncio
import json
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from retrieval.base import Hits, LocalRetriever
from retrieval.server import RequestError, create_app, parse_retrieve_request
from retrieval.settings import RetrievalConfig


class CountingRetriever(LocalRetriever):
    """Deterministic fake: document i of query q is f"{q}-{i}"; records every batch it is asked to search."""

    name = "fake"

    def __init__(self, delay_s: float = 0.0, fail: bool = False):
        self.calls: list[tuple[list[str], int]] = []
        self.delay_s = delay_s
        self.fail = fail

    def search(self, queries, topk):
        self.calls.append((list(queries), topk))
        if self.fail:
            raise RuntimeError("index exploded")
        time.sleep(self.delay_s)
        return [
            Hits(
                [{"id": f"{q}-{i}", "contents": f'"{q}"\ntext {i}'} for i in range(topk)],
                [1.0 / (i + 1) for i in range(topk)],
            )
            for q in queries
        ]


async def _client(retriever, token=None, **server):
    cfg = RetrievalConfig(token=token, server=server)
    client = TestClient(TestServer(create_app(retriever, cfg)))
    await client.start_server()
    return client


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1]", 400, "must be a JSON object"),
        (b"{}", 400, "missing 'queries'"),
        (b'{"queries": "a"}', 400, "'queries' must be a list"),
        (b'{"queries": ["a", 3]}', 400, r"queries\[1\] must be a string"),
        (b'{"queries": ["a"], "topk": "3"}', 400, "'topk' must be an integer"),
        (b'{"queries": ["a"], "topk": true}', 400, "'topk' must be an integer"),
        (b'{"queries": ["a"], "topk": 0}', 400, "between 1 and 100, got 0"),
        (b'{"queries": ["a"], "topk": 101}', 400, "between 1 and 100, got 101"),
        (b'{"queries": ["a"], "return_scores": "yes"}', 400, "'return_scores' must be true or false"),
        (b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply"),
        (b'{"queries": ["a"], "topk": ' + b"7" * 5000 + b"}", 400, "not valid JSON"),
        (b'{"queries": ["ok", "a\\ud800"]}', 400, r"queries\[1\] is not valid Unicode"),
        (json.dumps({"queries": ["q"] * 1025}).encode(), 413, r"1025 > max_queries_per_request \(1024\)"),
        (json.dumps({"queries": ["x" * 4097]}).encode(), 413, r"4097 characters > max_query_chars \(4096\)"),
    ],
)
def test_parse_rejects_bad_requests_with_reasons(body, status, message):
    with pytest.raises(RequestError, match=message) as info:
        parse_retrieve_request(body, RetrievalConfig())
    assert info.value.status == status


def test_parse_defaults_follow_search_r1():
    assert parse_retrieve_request(b'{"queries": ["a"]}', RetrievalConfig(topk=4)) == (["a"], 4, False)
    assert parse_retrieve_request(
        b'{"queries": [], "topk": null, "return_scores": true}', RetrievalConfig()
    ) == (
        [],
        3,
        True,
    )


def test_unknown_fields_are_ignored_and_reported():
    ignored: list[str] = []
    body = b'{"queries": ["a"], "top_k": 9, "topk": 2, "mode": "x", "return_scores": true}'
    assert parse_retrieve_request(body, RetrievalConfig(), ignored) == (["a"], 2, True)
    assert ignored == ["top_k", "mode"]
    assert parse_retrieve_request(b'{"queries": [], "extra": 1}', RetrievalConfig()) == ([], 3, False)


async def test_unknown_fields_are_served_like_search_r1_and_counted_in_metrics():
    retriever = CountingRetriever()
    client = await _client(retriever, cache_size=0)
    try:
        plain = await client.post("/retrieve", json={"queries": ["a"], "topk": 2, "return_scores": True})
        extra = await client.post(
            "/retrieve",
            json={"queries": ["a"], "topk": 2, "return_scores": True, "top_k": 7, "session": {"id": 1}},
        )
        assert (plain.status, extra.status) == (200, 200)
        assert (await extra.json()) == (await plain.json())
        # `top_k` is not `topk`: it is ignored, as Search-R1 does, and the request gets its topk
        assert len((await extra.json())["result"][0]) == 2
        resp = await client.post("/retrieve", json={"queries": ["b"], "filters": None})
        assert resp.status == 200 and len((await resp.json())["result"][0]) == 3
        metrics = await (await client.get("/metrics")).json()
        assert metrics["retrieval/unknown_fields"] == 3
        assert metrics["retrieval/requests"] == 3 and metrics["retrieval/errors"] == {}
    finally:
        await client.close()


async def test_deeply_nested_or_oversized_json_is_a_json_400_not_a_500():
    client = await _client(CountingRetriever())
    try:
        for body in (
            b"[" * 100_000 + b"]" * 100_000,
            b'{"queries": [' * 50_000 + b"]}" * 50_000,
            b'{"queries": ["a"], "topk": ' + b"9" * 5000 + b"}",
        ):
            resp = await client.post("/retrieve", data=body, headers={"Content-Type": "application/json"})
            assert resp.status == 400
            assert "not valid JSON" in (await resp.json())["error"]
        resp = await client.post("/retrieve", json={"queries": ["still serving"]})
        assert resp.status == 200
        metrics = await (await client.get("/metrics")).json()
        assert metrics["retrieval/errors"] == {"400": 3}
    finally:
        await client.close()


async def test_empty_queries_are_searched_and_get_topk_documents():
    retriever = CountingRetriever()
    client = await _client(retriever, cache_size=0)
    try:
        resp = await client.post("/retrieve", json={"queries": ["", "  \t", "x"], "topk": 4})
        assert resp.status == 200
        result = (await resp.json())["result"]
        assert [len(r) for r in result] == [4, 4, 4]
        assert [d["id"] for d in result[0]] == ["-0", "-1", "-2", "-3"]
        assert sorted(q for batch, _ in retriever.calls for q in batch) == ["", "  \t", "x"]
    finally:
        await client.close()


async def test_empty_query_gets_the_first_topk_bm25_passages(bm25):
    client = await _client(bm25, cache_size=0)
    try:
        body = {"queries": ["", "   ", "capital of Japan"], "topk": 5, "return_scores": True}
        resp = await client.post("/retrieve", json=body)
        assert resp.status == 200
        blank, spaces, japan = (await resp.json())["result"]
        first_five = [bm25.store.get(row)["id"] for row in range(5)]
        assert first_five[:3] == ["paris", "tokyo", "nile"]
        assert [e["document"]["id"] for e in blank] == first_five
        assert [e["score"] for e in blank] == [0.0] * 5 and spaces == blank
        assert japan[0]["document"]["id"] == "tokyo" and japan[0]["score"] > 0
    finally:
        await client.close()


async def test_answer_shapes_with_and_without_scores():
    client = await _client(CountingRetriever())
    try:
        resp = await client.post("/retrieve", json={"queries": ["a", "b"], "topk": 2, "return_scores": True})
        assert resp.status == 200
        result = (await resp.json())["result"]
        assert [[e["document"]["id"] for e in r] for r in result] == [["a-0", "a-1"], ["b-0", "b-1"]]
        assert result[0][0]["score"] == 1.0 and set(result[0][0]) == {"document", "score"}
        resp = await client.post("/retrieve", json={"queries": ["a"], "topk": 1, "return_scores": False})
        assert (await resp.json()) == {"result": [[{"id": "a-0", "contents": '"a"\ntext 0'}]]}
        resp = await client.post("/retrieve", json={"queries": []})
        assert (await resp.json()) == {"result": []}
        health = await (await client.get("/health")).json()
        assert health["status"] == "ok"
    finally:
        await client.close()


async def test_http_errors_are_json():
    client = await _client(CountingRetriever(), max_body_bytes=2048, token="s3cret")
    auth = {"Authorization": "Bearer s3cret"}
    try:
        resp = await client.post("/retrieve", json={"queries": ["a"]})
        assert resp.status == 401 and "bearer token" in (await resp.json())["error"]
        resp = await client.post("/retrieve", data=b"{oops", headers=auth)
        assert resp.status == 400 and "not valid JSON" in (await resp.json())["error"]
        resp = await client.post("/retrieve", json={"queries": ["a" * 3000]}, headers=auth)
        assert resp.status == 413 and "max_body_bytes (2048)" in (await resp.json())["error"]
        resp = await client.get("/nope")
        assert resp.status == 404 and "POST /retrieve" in (await resp.json())["error"]
        resp = await client.get("/retrieve")
        assert resp.status == 405 and "error" in await resp.json()
        resp = await client.post("/retrieve", json={"queries": ["fine"]}, headers=auth)
        assert resp.status == 200
        metrics = await (await client.get("/metrics")).json()
        assert metrics["retrieval/errors"]["401"] == 1 and metrics["retrieval/requests"] == 1
    finally:
        await client.close()


async def test_search_failure_is_a_json_500_and_the_server_keeps_serving():
    retriever = CountingRetriever(fail=True)
    client = await _client(retriever)
    try:
        resp = await client.post("/retrieve", json={"queries": ["a"]})
        assert resp.status == 500 and "index exploded" in (await resp.json())["error"]
        retriever.fail = False
        resp = await client.post("/retrieve", json={"queries": ["a"]})
        assert resp.status == 200
    finally:
        await client.close()


async def test_concurrent_requests_are_coalesced_into_few_searches():
    retriever = CountingRetriever(delay_s=0.02)
    client = await _client(retriever, batch_window_ms=5, cache_size=0)
    try:
        queries = [f"q{i}" for i in range(64)]
        answers = await asyncio.gather(
            *(
                client.post("/retrieve", json={"queries": [q], "topk": 3, "return_scores": True})
                for q in queries
            )
        )
        results = [(await a.json())["result"][0] for a in answers]
        assert [r[0]["document"]["id"] for r in results] == [f"{q}-0" for q in queries]
        assert sum(len(c[0]) for c in retriever.calls) == 64
        assert len(retriever.calls) <= 16, f"64 concurrent requests took {len(retriever.calls)} searches"
    finally:
        await client.close()


async def test_different_topk_are_searched_separately_and_duplicates_once():
    retriever = CountingRetriever(delay_s=0.01)
    client = await _client(retriever, batch_window_ms=20, cache_size=0)
    try:
        bodies = [
            {"queries": ["a", "a"], "topk": 2},
            {"queries": ["a"], "topk": 5},
            {"queries": ["b"], "topk": 2},
        ]
        answers = await asyncio.gather(*(client.post("/retrieve", json=b) for b in bodies))
        results = [(await a.json())["result"] for a in answers]
        assert [len(r[0]) for r in results] == [2, 5, 2]
        assert sorted((tuple(q), k) for q, k in retriever.calls) == [(("a",), 5), (("a", "b"), 2)]
    finally:
        await client.close()


async def test_cache_answers_repeated_queries_without_searching():
    retriever = CountingRetriever()
    client = await _client(retriever, cache_size=10)
    try:
        for _ in range(3):
            await client.post("/retrieve", json={"queries": ["same"], "topk": 3})
        await client.post("/retrieve", json={"queries": ["same"], "topk": 2})
        assert len(retriever.calls) == 2
        metrics = await (await client.get("/metrics")).json()
        assert metrics["retrieval/cache_hits"] == 2
    finally:
        await client.close()


async def test_naive_mode_searches_each_request_alone():
    retriever = CountingRetriever(delay_s=0.01)
    client = await _client(retriever, batching=False, cache_size=0)
    try:
        await asyncio.gather(*(client.post("/retrieve", json={"queries": [f"q{i}"]}) for i in range(8)))
        assert len(retriever.calls) == 8
    finally:
        await client.close()


async def test_bm25_results_through_the_batcher_equal_direct_search(bm25):
    client = await _client(bm25, cache_size=0, batch_window_ms=10)
    queries = ["capital of France", "silver bridge", "Norvale river", "ancient temple", "capital of Japan"]
    try:
        answers = await asyncio.gather(
            *(
                client.post("/retrieve", json={"queries": [q], "topk": 4, "return_scores": True})
                for q in queries
            )
        )
        for q, a in zip(queries, answers, strict=True):
            got = (await a.json())["result"][0]
            direct = bm25.search([q], 4)[0]
            assert [e["document"] for e in got] == direct.docs
            assert [e["score"] for e in got] == pytest.approx(direct.scores)
    finally:
        await client.close()


# --- several workers on one port (retrieval/pool.py): counters shared, summed and carried over a restart -------
def test_pool_metrics_sum_counts_and_report_the_worst_latency():
    import multiprocessing as mp

    from retrieval.pool import SharedCounters
    from retrieval.server import ServerState

    peers = SharedCounters(2, mp.get_context("spawn"))
    cfg = RetrievalConfig(server={"cache_size": 0})
    first, second = (ServerState(CountingRetriever(), cfg, peers, slot) for slot in (0, 1))
    first.requests, first.queries, first.errors = 3, 5, {400: 1, 418: 2}
    first.latencies.extend([0.001, 0.002, 0.003])
    second.requests, second.queries, second.errors = 4, 4, {400: 2}
    second.latencies.extend([0.010] * 3)
    second.publish_counters()
    m = first.metrics()
    assert m["retrieval/workers"] == 2 and m["retrieval/worker_requests"] == [3, 4]
    assert (m["retrieval/requests"], m["retrieval/queries"]) == (7, 9)
    assert m["retrieval/errors"] == {"400": 3, "other": 2}
    assert m["retrieval/latency_p50_ms"] == pytest.approx(10.0)  # the slower worker's
    # a worker restarted into slot 1 carries on from what its predecessor last published
    restarted = ServerState(CountingRetriever(), cfg, peers, 1)
    restarted.requests = 1
    assert first.metrics()["retrieval/worker_requests"] == [3, 4]
    restarted.publish_counters()
    assert first.metrics()["retrieval/worker_requests"] == [3, 5]


def test_pool_metrics_sum_unknown_fields_across_workers():
    import multiprocessing as mp

    from retrieval.pool import SharedCounters
    from retrieval.server import ServerState

    peers = SharedCounters(2, mp.get_context("spawn"))
    first, second = (ServerState(CountingRetriever(), RetrievalConfig(), peers, slot) for slot in (0, 1))
    first.count_unknown_fields(["top_k"])
    second.count_unknown_fields(["top_k", "mode", "mode"])
    second.publish_counters()
    assert first.metrics()["retrieval/unknown_fields"] == 4
    assert second.logged_fields == {"top_k", "mode"}


def test_worker_count_defaults_to_cores_only_for_a_prebuilt_bm25_index(tmp_path, monkeypatch):
    from retrieval.pool import resolve_workers

    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert resolve_workers(RetrievalConfig(retriever={"method": "bm25", "index_path": tmp_path})) == 8
    assert (
        resolve_workers(RetrievalConfig(retriever="bm25")) == 1
    )  # the index is built at start: once is enough
    dense = {"method": "dense", "index_path": tmp_path}
    assert resolve_workers(RetrievalConfig(retriever=dense)) == 1
    assert resolve_workers(RetrievalConfig(retriever=dense, server={"workers": 3})) == 3
