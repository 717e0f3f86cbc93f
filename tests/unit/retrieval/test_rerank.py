"""Search-R1's `/rerank` API on both sides: sr1's remote reranker against a loopback server that answers as Search-R1's
`rerank_server.py` does (and as it fails: malformed answers, errors, timeouts), the retrieval client that reranks its
candidates there, and sr1's own `/rerank` endpoint against that client."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from retrieval.base import Hits, LocalRetriever
from retrieval.client import RetrievalClient
from retrieval.http_json import EndpointFailed
from retrieval.rerank_api import document_of, passage_text
from retrieval.rerank_client import RemoteReranker
from retrieval.reranker import CrossEncoderReranker, RerankingRetriever
from retrieval.server import create_app
from retrieval.settings import RetrievalConfig
from tasks.search_r1.protocol import format_documents

# -- a server that answers as Search-R1's rerank_server.py ---------------------------------------------------------


def search_r1_passage(doc_item: dict) -> str:
    """What Search-R1's reranker makes of a document (written out here, independently of sr1's code)."""
    contents = doc_item["document"]["contents"] if "document" in doc_item else doc_item["contents"]
    lines = contents.split("\n")
    return "(Title: " + lines[0] + ") " + "\n".join(lines[1:])


def score(query: str, passage: str) -> float:
    """A deterministic stand-in for the cross-encoder: words of the query found in the passage, then shorter first."""
    words = set(query.lower().split())
    return sum(w in passage.lower() for w in words) - len(passage) / 1000


def search_r1_answer(body: dict) -> dict:
    """Search-R1's /rerank: every query scored against every document of the request, best `rerank_topk` kept."""
    topk = body.get("rerank_topk") or 3
    result = []
    for query in body["queries"]:
        pairs = [
            (search_r1_passage(d), score(query, search_r1_passage(d)))
            for docs in body["documents"]
            for d in docs
        ]
        pairs.sort(key=lambda p: p[1], reverse=True)
        if body.get("return_scores"):
            result.append([{"document": doc, "score": s} for doc, s in pairs[:topk]])
        else:
            result.append([doc for doc, _ in pairs[:topk]])
    return {"result": result}


CANDIDATES = [
    {"id": "7", "contents": '"Nile"\nThe Nile flows north through Egypt.'},
    {"id": "3", "contents": '"Paris"\nParis is the capital of France.'},
    {"id": "9", "contents": '"Paris (band)"\nParis was a rock band; the capital of France is its namesake.'},
    {"id": "4", "contents": '"Tokyo"\nTokyo is the capital of Japan.'},
]


async def _start(routes: dict) -> TestServer:
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_post(path, handler)
    server = TestServer(app)
    await server.start_server()
    return server


@pytest.fixture
async def search_r1_reranker():
    """A loopback /rerank server speaking Search-R1's format; its `mode` decides how it answers; it records bodies."""
    state = {"mode": "ok", "bodies": []}

    async def rerank(request):
        body = await request.json()
        state["bodies"].append(body)
        mode = state["mode"]
        if mode == "ok":
            return web.json_response(search_r1_answer(body))
        if mode == "slow":
            await asyncio.sleep(1.0)
            return web.json_response(search_r1_answer(body))
        if mode == "busy_once":
            state["mode"] = "ok"
            return web.json_response({"detail": "busy"}, status=503)
        if mode == "unprocessable":  # FastAPI's answer to a body its pydantic model refuses
            return web.json_response(
                {"detail": [{"loc": ["body", "documents"], "msg": "field required"}]}, status=422
            )
        return web.Response(text=mode, content_type="application/json")  # the mode is the raw answer

    server = await _start({"/rerank": rerank})
    state["url"] = str(server.make_url("/rerank"))
    yield state
    await server.close()


def _reranker(url: str, **kwargs) -> RemoteReranker:
    return RemoteReranker(url, **{"timeout_s": 2.0, "max_retries": 2, "backoff_s": 0.01, **kwargs})


async def test_the_remote_reranker_speaks_search_r1s_format(search_r1_reranker):
    reranker = _reranker(search_r1_reranker["url"])
    try:
        docs, scores = await reranker.rerank("capital of France", CANDIDATES, topk=2)
    finally:
        await reranker.close()
    # the request is Search-R1's: one query, its documents, rerank_topk, scores asked for
    (body,) = search_r1_reranker["bodies"]
    assert body == {
        "queries": ["capital of France"],
        "documents": [CANDIDATES],
        "rerank_topk": 2,
        "return_scores": True,
    }
    # its strings are mapped back to the candidates they came from (ids kept), in its order
    assert [d["id"] for d in docs] == ["3", "9"] and scores == sorted(scores, reverse=True)
    # the observation has the bytes Search-R1's generation shows for this answer (`Doc {i}{document}`)
    shown = "".join(
        f"Doc {i + 1}{e['document']}\n" for i, e in enumerate(search_r1_answer(body)["result"][0])
    )
    assert format_documents(docs) == shown.strip()


@pytest.mark.parametrize(
    "answer, reason",
    [
        ('{"results": []}', "no 'result' list holding one list"),
        ('{"result": []}', "no 'result' list holding one list"),
        ('{"result": [[], []]}', "no 'result' list holding one list"),
        ('{"result": [{"document": "x"}]}', "no 'result' list holding one list"),
        ('{"result": [[{"score": 1.0}]]}', r"result\[0\]\[0\] has no 'document'"),
        ('{"result": [[{"document": "(Title: x) y", "score": "high"}]]}', "score that is not a number"),
        ('{"result": [["Paris is the capital"]]}', "neither one of the documents sent nor in the"),
        ('{"result": [[42]]}', r"result\[0\]\[0\] is not a document"),
        ("[1, 2", "answered with invalid JSON"),
    ],
)
async def test_a_malformed_answer_is_a_failure_naming_what_is_wrong(search_r1_reranker, answer, reason):
    search_r1_reranker["mode"] = answer
    reranker = _reranker(search_r1_reranker["url"])
    try:
        with pytest.raises(EndpointFailed, match=reason):
            await reranker.rerank("capital of France", CANDIDATES, topk=2)
    finally:
        await reranker.close()
    # a wrong shape is not retried; invalid JSON is (a proxy may have cut the answer)
    assert len(search_r1_reranker["bodies"]) == (3 if "invalid JSON" in reason else 1)


async def test_timeouts_and_server_errors_are_retried_client_errors_are_not(search_r1_reranker, free_port):
    search_r1_reranker["mode"] = "busy_once"
    reranker = _reranker(search_r1_reranker["url"])
    try:
        docs, _ = await reranker.rerank("capital of France", CANDIDATES, topk=1)
        assert [d["id"] for d in docs] == ["3"] and reranker.stats["retries"] == 1
    finally:
        await reranker.close()
    search_r1_reranker["mode"] = "slow"
    reranker = _reranker(search_r1_reranker["url"], timeout_s=0.1, max_retries=1)
    try:
        with pytest.raises(EndpointFailed, match=r"the reranker did not answer within 0.1s") as failed:
            await reranker.rerank("q", CANDIDATES, topk=1)
        assert failed.value.attempts == 2
    finally:
        await reranker.close()
    search_r1_reranker["mode"] = "unprocessable"
    reranker = _reranker(search_r1_reranker["url"])
    try:
        with pytest.raises(EndpointFailed, match=r"rejected the request \(HTTP 422\): .*field required"):
            await reranker.rerank("q", CANDIDATES, topk=1)
        assert reranker.stats["requests"] == 1
    finally:
        await reranker.close()
    reranker = _reranker(f"http://127.0.0.1:{free_port}", max_retries=0)  # "/rerank" is added
    try:
        with pytest.raises(
            EndpointFailed, match=rf"cannot reach the reranker at http://127.0.0.1:{free_port}/rerank"
        ):
            await reranker.rerank("q", CANDIDATES, topk=1)
    finally:
        await reranker.close()


def test_passages_and_their_documents_round_trip():
    for doc in [
        *CANDIDATES,
        {"contents": '"Only a title"'},
        {"contents": '"A (b) c") d\ne'},
        {"contents": "x\ny"},
    ]:
        text = passage_text(doc)
        back = document_of(text)
        assert back is not None and passage_text(back) == text
    assert document_of('(Title: "Paris (band)") Paris was a band') == {
        "id": "",
        "contents": '"Paris (band)"\nParis was a band',
    }
    assert document_of("no title here") is None


# -- the retrieval client with a remote reranker --------------------------------------------------------------------


async def test_a_search_reranks_its_candidates_remotely(search_r1_reranker):
    asked = []

    async def retrieve(request):
        body = await request.json()
        asked.append(body)
        docs = [] if body["queries"][0] == "nothing" else CANDIDATES[: body["topk"]]
        return web.json_response({"result": [[{"document": d, "score": 1.0} for d in docs]]})

    retrieval = await _start({"/retrieve": retrieve})
    cfg = RetrievalConfig(
        client={"url": str(retrieval.make_url("/retrieve")), "backoff_s": 0.01},
        topk=2,
        reranker={"enabled": True, "url": search_r1_reranker["url"], "candidates": 4},
    )
    client = RetrievalClient.from_config(cfg)
    try:
        result = await client.search("capital of France")
        assert result.ok and [d["id"] for d in result.documents] == ["3", "9"]
        assert asked[-1]["topk"] == 4  # the candidates, from /retrieve
        assert search_r1_reranker["bodies"][-1]["rerank_topk"] == 2  # retrieval.topk kept
        # a search that finds nothing has nothing to rerank
        empty = await client.search("nothing")
        assert empty.ok and empty.documents == [] and len(search_r1_reranker["bodies"]) == 1
        # a reranker that fails makes the search fail, and the model is told why
        search_r1_reranker["mode"] = '{"result": []}'
        failed = await client.search("capital of Japan")
        assert not failed.ok and "the reranker's answer has no 'result' list" in failed.error
        assert format_documents(failed.documents, failed.error).startswith("Search unavailable: the reranker")
    finally:
        await client.close()
        await retrieval.close()


# -- sr1's own /rerank, as Search-R1's generation and sr1's client call it -----------------------------------------


class WordScorer(CrossEncoderReranker):
    """The cross-encoder's interface with `score` above; records the pairs it scored."""

    def __init__(self):
        self.pairs: list[tuple[str, str]] = []

    def score_pairs(self, pairs):
        self.pairs.extend(pairs)
        return np.array([score(q, p) for q, p in pairs], dtype=np.float32)


class NoSearch(LocalRetriever):
    name = "none"

    def search(self, queries, topk):
        return [Hits() for _ in queries]


async def _post(url: str, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        return resp.status, await resp.json()


async def _sr1_server(reranker: CrossEncoderReranker | None) -> TestServer:
    retriever = RerankingRetriever(NoSearch(), reranker, candidates=5) if reranker else NoSearch()
    server = TestServer(create_app(retriever, RetrievalConfig(server={"max_topk": 10})))
    await server.start_server()
    return server


async def test_sr1s_rerank_endpoint_answers_search_r1s_requests_and_sr1s_client():
    scorer = WordScorer()
    server = await _sr1_server(scorer)
    url = str(server.make_url("/rerank"))
    try:
        reranker = _reranker(url)
        try:
            docs, scores = await reranker.rerank("capital of France", CANDIDATES, topk=3)
        finally:
            await reranker.close()
        assert [d["id"] for d in docs] == ["3", "9", "4"] and scores == sorted(scores, reverse=True)
        # Search-R1's generation sends /retrieve's entries as they came; each query is scored against its own only
        body = {
            "queries": ["capital of France", "Nile"],
            "documents": [
                [{"document": d, "score": 1.0} for d in CANDIDATES[1:]],
                [{"document": CANDIDATES[0]}],
            ],
            "rerank_topk": 2,
            "return_scores": False,
        }
        scorer.pairs.clear()
        status, answer = await _post(url, body)
        assert status == 200 and len(scorer.pairs) == 4
        assert answer == {
            "result": [
                [search_r1_passage(CANDIDATES[1]), search_r1_passage(CANDIDATES[2])],
                [search_r1_passage(CANDIDATES[0])],
            ]
        }
    finally:
        await server.close()


@pytest.mark.parametrize(
    "body, status, message",
    [
        ({"queries": ["q"]}, 400, "'documents' must be a list of 1 lists, one per query"),
        ({"queries": "q", "documents": [[]]}, 400, "'queries' must be a list of strings"),
        ({"queries": ["q"], "documents": [[{"id": "1"}]]}, 400, r"documents\[0\]\[0\] must be a document"),
        ({"queries": ["q"], "documents": [[{"contents": "x"}] * 11]}, 413, r"11 documents > max_topk \(10\)"),
        ({"queries": ["q"], "documents": [[]], "rerank_topk": -1}, 400, "'rerank_topk' must be a positive"),
        (
            {"queries": ["q"], "documents": [[]], "return_scores": "yes"},
            400,
            "'return_scores' must be true or",
        ),
    ],
)
async def test_bad_rerank_requests_get_json_4xx_with_reasons(body, status, message):
    server = await _sr1_server(WordScorer())
    try:
        got, answer = await _post(str(server.make_url("/rerank")), body)
        assert got == status, answer
        assert re.search(message, answer["error"]), answer
    finally:
        await server.close()


async def test_a_server_without_a_cross_encoder_says_how_to_serve_rerank():
    server = await _sr1_server(None)
    reranker = _reranker(str(server.make_url("/rerank")))
    try:
        with pytest.raises(EndpointFailed, match=r"HTTP 404.*retrieval.reranker.model="):
            await reranker.rerank("q", CANDIDATES, topk=1)
    finally:
        await reranker.close()
        await server.close()
