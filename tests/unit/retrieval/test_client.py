"""The async client against small in-process aiohttp servers: sharing, retries, failures."""

import asyncio
import json

from aiohttp import web
from aiohttp.test_utils import TestServer

from retrieval.client import RetrievalClient, SearchResult
from tasks.search_r1.protocol import format_documents
from tests.timing import scaled


def test_a_result_is_ok_unless_it_has_an_error():
    assert not SearchResult("q", error="x").ok and SearchResult("q").ok


async def _server(handler):
    app = web.Application()
    app.router.add_post("/retrieve", handler)
    server = TestServer(app)
    await server.start_server()
    return server


def _answer(queries, topk):
    return {
        "result": [
            [
                {"document": {"id": f"{q}{i}", "contents": f'"{q}"\nt{i}'}, "score": float(topk - i)}
                for i in range(topk)
            ]
            for q in queries
        ]
    }


async def test_identical_inflight_queries_share_one_request():
    seen = []

    async def handler(request):
        body = await request.json()
        seen.append(body)
        await asyncio.sleep(0.05)
        return web.json_response(_answer(body["queries"], body["topk"]))

    server = await _server(handler)
    try:
        async with RetrievalClient(str(server.make_url("/retrieve")), topk=2) as client:
            results = await client.search_many(["who", "who", "what", "who"])
            assert [r.query for r in results] == ["who", "who", "what", "who"]
            assert all(r.ok for r in results) and results[0].documents[0]["id"] == "who0"
            assert results[0].scores == [2.0, 1.0]
            assert sorted(b["queries"][0] for b in seen) == ["what", "who"]
            assert seen[0]["return_scores"] is True and seen[0]["topk"] == 2
            # once finished, the same query is asked again (no stale sharing)
            await client.search("who")
            assert len(seen) == 3
    finally:
        await server.close()


async def test_retries_server_errors_then_succeeds():
    attempts = []

    async def handler(request):
        attempts.append(1)
        if len(attempts) < 3:
            return web.json_response({"error": "busy"}, status=503)
        body = await request.json()
        return web.json_response(_answer(body["queries"], 1))

    server = await _server(handler)
    try:
        async with RetrievalClient(
            str(server.make_url("/")), topk=1, backoff_s=0.01, max_retries=3
        ) as client:
            result = await client.search("q")
            assert result.ok and len(attempts) == 3 and client.stats["retries"] == 2
    finally:
        await server.close()


async def test_client_errors_are_not_retried_and_reported():
    attempts = []

    async def handler(request):
        attempts.append(1)
        return web.json_response({"error": "'topk' must be between 1 and 100, got 500"}, status=400)

    server = await _server(handler)
    try:
        async with RetrievalClient(str(server.make_url("/retrieve")), topk=500, backoff_s=0.01) as client:
            result = await client.search("q")
            assert not result.ok and "got 500" in result.error and len(attempts) == 1
    finally:
        await server.close()


async def test_timeouts_are_retried_and_end_in_an_explicit_failure():
    async def handler(request):
        await asyncio.sleep(1.0)
        return web.json_response({})

    server = await _server(handler)
    try:
        async with RetrievalClient(
            str(server.make_url("/retrieve")), timeout_s=0.1, max_retries=1, backoff_s=0.01
        ) as client:
            result = await client.search("q")
            assert "did not answer within 0.1s" in result.error
            assert format_documents(result.documents, result.error).startswith("Search unavailable")
    finally:
        await server.close()


async def test_server_down_gives_a_failure_result_not_an_exception(free_port):
    async with RetrievalClient(
        f"http://127.0.0.1:{free_port}/retrieve", max_retries=2, backoff_s=0.01
    ) as client:
        results = await client.search_many(["a", "b"])
    assert all(not r.ok and "cannot reach the retrieval server" in r.error for r in results)
    assert client.stats["requests"] == 6


async def test_malformed_answer_is_a_failure():
    async def handler(request):
        return web.Response(text=json.dumps({"result": []}), content_type="application/json")

    server = await _server(handler)
    try:
        async with RetrievalClient(str(server.make_url("/retrieve")), backoff_s=0.01) as client:
            result = await client.search("q")
            assert not result.ok and "one entry per query" in result.error
    finally:
        await server.close()


async def test_a_cancelled_caller_does_not_cancel_the_shared_request():
    async def handler(request):
        await asyncio.sleep(0.1)
        body = await request.json()
        return web.json_response(_answer(body["queries"], 1))

    server = await _server(handler)
    try:
        async with RetrievalClient(str(server.make_url("/retrieve")), topk=1) as client:
            first = asyncio.create_task(client.search("q"))
            second = asyncio.create_task(client.search("q"))
            await asyncio.sleep(0.02)
            first.cancel()
            result = await second
            assert result.ok and result.documents[0]["id"] == "q0"
    finally:
        await server.close()


async def test_a_cut_network_is_a_failure_result_within_the_timeout_and_searches_work_again_after():
    """Through a fault proxy (fakes/fault_proxy.py): a black hole (connections open, nothing answered) and a
    drop (connections reset) both end as a "Search unavailable" result after the client's retries, never a hang;
    once the network is back the next search succeeds on a fresh connection."""
    from fakes.fault_proxy import FaultProxy

    async def handler(request):
        body = await request.json()
        return web.json_response(_answer(body["queries"], body["topk"]))

    server = await _server(handler)
    try:
        with FaultProxy(("127.0.0.1", server.port)) as proxy:
            url = f"http://127.0.0.1:{proxy.port}/retrieve"
            async with RetrievalClient(url, topk=2, timeout_s=0.3, max_retries=1, backoff_s=0.01) as client:
                assert (await client.search("before")).ok
                proxy.blackhole()
                result = await asyncio.wait_for(client.search("cut"), timeout=scaled(10))
                assert "did not answer within 0.3s" in result.error
                proxy.restore()
                assert (await client.search("back")).documents[0]["id"] == "back0"
                proxy.drop()
                result = await asyncio.wait_for(client.search("dropped"), timeout=scaled(10))
                assert not result.ok and format_documents(result.documents, result.error).startswith(
                    "Search unavailable"
                )
                proxy.restore()
                assert (await client.search("again")).ok
    finally:
        await server.close()
