"""Online engine adapters against loopback fakes that answer in each vendor's JSON layout."""

from __future__ import annotations

import contextlib

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from retrieval.factory import build_retriever
from retrieval.online import OnlineSearchError
from retrieval.server import create_app
from retrieval.settings import RetrievalConfig

RESULTS = [
    (
        "https://en.wikipedia.org/wiki/Paris",
        "Paris - Wikipedia",
        "Paris is the <b>capital</b> of France &amp; its largest city.",
    ),
    ("https://www.britannica.com/place/Paris", "Paris | Britannica", "Paris, city and capital of France."),
    ("https://example.org/paris", "Visit Paris", "Guide to the city."),
]


def google_answer(q, n):
    items = [
        {
            "kind": "customsearch#result",
            "title": t,
            "htmlTitle": t,
            "link": u,
            "displayLink": u.split("/")[2],
            "snippet": s,
            "htmlSnippet": s,
        }
        for u, t, s in RESULTS[:n]
    ]
    return {
        "kind": "customsearch#search",
        "queries": {"request": [{"searchTerms": q, "count": n}]},
        "searchInformation": {"totalResults": "3"},
        "items": items,
    }


def bing_answer(q, n):
    value = [
        {
            "id": f"https://api.bing.microsoft.com/api/v7/#WebPages.{i}",
            "name": t,
            "url": u,
            "displayUrl": u,
            "snippet": s,
            "language": "en",
        }
        for i, (u, t, s) in enumerate(RESULTS[:n])
    ]
    return {
        "_type": "SearchResponse",
        "queryContext": {"originalQuery": q},
        "webPages": {
            "webSearchUrl": "https://www.bing.com/search?q=x",
            "totalEstimatedMatches": 3,
            "value": value,
        },
    }


def brave_answer(q, n):
    results = [
        {
            "type": "search_result",
            "title": t,
            "url": u,
            "description": s.replace("<b>", "<strong>").replace("</b>", "</strong>"),
            "language": "en",
        }
        for u, t, s in RESULTS[:n]
    ]
    return {"type": "search", "query": {"original": q}, "web": {"type": "search", "results": results}}


def serpapi_answer(q, n):
    organic = [
        {"position": i + 1, "title": t, "link": u, "displayed_link": u, "snippet": s}
        for i, (u, t, s) in reversed(list(enumerate(RESULTS[:n])))
    ]
    return {
        "search_metadata": {"id": "x", "status": "Success"},
        "search_parameters": {"engine": "google", "q": q},
        "organic_results": organic,
    }


VENDORS = {
    # method: (path, key env, how the key is sent, count param, answer)
    "google": ("/customsearch/v1", "GOOGLE_API_KEY", ("param", "key"), "num", google_answer),
    "bing": ("/v7.0/search", "BING_API_KEY", ("header", "Ocp-Apim-Subscription-Key"), "count", bing_answer),
    "brave": (
        "/res/v1/web/search",
        "BRAVE_API_KEY",
        ("header", "X-Subscription-Token"),
        "count",
        brave_answer,
    ),
    "serpapi": ("/search.json", "SERPAPI_API_KEY", ("param", "api_key"), "num", serpapi_answer),
}


async def _fake_vendor(method, seen, fail=False):
    path, _, (where, key_name), count, answer = VENDORS[method]

    async def handler(request):
        seen.append(request)
        got_key = request.query.get(key_name) if where == "param" else request.headers.get(key_name)
        if fail or got_key != "k3y":
            return web.json_response({"error": {"code": 403, "message": "bad key"}}, status=403)
        return web.json_response(answer(request.query["q"], int(request.query[count])))

    app = web.Application()
    app.router.add_get(path, handler)
    server = TestServer(app)
    await server.start_server()
    return server


@pytest.mark.parametrize("method", sorted(VENDORS))
async def test_engine_returns_corpus_shaped_documents(method, monkeypatch):
    monkeypatch.setenv(VENDORS[method][1], "k3y")
    monkeypatch.setenv("GOOGLE_CSE_ID", "cx1")
    seen = []
    vendor = await _fake_vendor(method, seen)
    engine = build_retriever(
        RetrievalConfig(retriever={"method": method, "base_url": str(vendor.make_url(""))})
    )
    try:
        hits = await engine.asearch(["capital of France", "paris"], 2)
    finally:
        await engine.aclose()
        await vendor.close()
    assert len(seen) == 2 and {r.query["q"] for r in seen} == {"capital of France", "paris"}
    if method == "google":
        assert seen[0].query["cx"] == "cx1"
    assert [d["id"] for d in hits[0].docs] == [RESULTS[0][0], RESULTS[1][0]]
    assert (
        hits[0].docs[0]["contents"]
        == '"Paris - Wikipedia"\nParis is the capital of France & its largest city.'
    )
    assert hits[0].scores == [1.0, 0.5]


@contextlib.asynccontextmanager
async def _served(method: str, seen: list, fail: bool = False):
    """The retrieval server in front of a fake vendor: (its test client, the vendor, the online config)."""
    vendor = await _fake_vendor(method, seen, fail=fail)
    cfg = RetrievalConfig(retriever={"method": method, "base_url": str(vendor.make_url(""))})
    client = TestClient(TestServer(create_app(build_retriever(cfg), cfg)))
    await client.start_server()
    try:
        yield client, cfg
    finally:
        await client.close()
        await vendor.close()


async def test_online_engine_behind_the_server_and_vendor_errors_are_502(monkeypatch):
    monkeypatch.setenv("BRAVE_API_KEY", "k3y")
    async with _served("brave", []) as (client, cfg):
        resp = await client.post("/retrieve", json={"queries": ["paris"], "topk": 3, "return_scores": True})
        result = (await resp.json())["result"]
        assert [e["document"]["id"] for e in result[0]] == [u for u, _, _ in RESULTS]
        monkeypatch.setenv("BRAVE_API_KEY", "wrong")
        bad = build_retriever(cfg)
        with pytest.raises(OnlineSearchError, match="HTTP 403"):
            await bad.asearch(["x"], 1)
        await bad.aclose()


async def test_vendor_failure_through_the_server_is_a_json_502(monkeypatch):
    monkeypatch.setenv("SERPAPI_API_KEY", "k3y")
    async with _served("serpapi", [], fail=True) as (client, _):
        resp = await client.post("/retrieve", json={"queries": ["paris"]})
        assert resp.status == 502 and "serpapi answered HTTP 403" in (await resp.json())["error"]


async def test_empty_query_is_not_sent_to_the_vendor(monkeypatch):
    monkeypatch.setenv("BRAVE_API_KEY", "k3y")
    seen = []
    async with _served("brave", seen) as (client, _):
        resp = await client.post("/retrieve", json={"queries": ["", "  ", "paris"], "topk": 2})
        assert resp.status == 200
        assert [len(r) for r in (await resp.json())["result"]] == [0, 0, 2]
        assert [r.query["q"] for r in seen] == ["paris"]


def test_missing_key_names_the_variable(monkeypatch):
    monkeypatch.delenv("BING_API_KEY", raising=False)
    with pytest.raises(ValueError, match="BING_API_KEY"):
        build_retriever(RetrievalConfig(retriever="bing"))
