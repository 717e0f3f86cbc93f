"""The retrieval server's quiet failures made loud: a non-UTF-8 Authorization header, a retriever that answers the
wrong number of results, a batching loop that dies (in-process aiohttp test server on loopback)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from aiohttp.test_utils import TestClient, TestServer

from retrieval.base import Hits, LocalRetriever
from retrieval.server import STATE_KEY, create_app
from retrieval.settings import RetrievalConfig
from tests.timing import scaled


class EchoRetriever(LocalRetriever):
    """Document i of query q is f"{q}-{i}"; `drop` answers one result fewer than asked (a retriever bug)."""

    name = "echo"

    def __init__(self) -> None:
        self.drop = False

    def search(self, queries, topk):
        hits = [Hits([{"id": f"{q}-{i}", "contents": q} for i in range(topk)], [1.0] * topk) for q in queries]
        return hits[:-1] if self.drop else hits


async def _client(retriever, token=None, **server) -> TestClient:
    client = TestClient(TestServer(create_app(retriever, RetrievalConfig(token=token, server=server))))
    await client.start_server()
    return client


async def _raw_request(client: TestClient, head: bytes, body: bytes = b"{}") -> tuple[int, dict]:
    """One HTTP/1.1 request written byte for byte (aiohttp's client would not send a header that is not UTF-8)."""
    reader, writer = await asyncio.open_connection(client.host, client.port)
    writer.write(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    status = int(answer.split(b" ", 2)[1])
    return status, json.loads(answer.split(b"\r\n\r\n", 1)[1])


async def test_an_authorization_header_that_is_not_utf8_is_a_401_without_a_traceback(caplog):
    client = await _client(EchoRetriever(), token="s3cret")
    try:
        with caplog.at_level(logging.INFO):
            for value in (b"Bearer \xff\xfe", b"\xc3(", b"Bearer s3cret\x80"):
                head = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nAuthorization: " + value + b"\r\n"
                status, answer = await _raw_request(client, head, b'{"queries": ["a"]}')
                assert status == 401 and "bearer token" in answer["error"]
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
        head = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n"
        assert (await _raw_request(client, head, b'{"queries": ["a"]}'))[0] == 200
    finally:
        await client.close()


async def test_a_retriever_answering_the_wrong_number_of_results_fails_that_request_only():
    retriever = EchoRetriever()
    client = await _client(retriever, cache_size=0)
    try:
        retriever.drop = True
        resp = await asyncio.wait_for(client.post("/retrieve", json={"queries": ["a", "b"]}), scaled(10))
        assert resp.status == 500 and "answered 2 queries with 1 results" in (await resp.json())["error"]
        retriever.drop = False
        resp = await asyncio.wait_for(client.post("/retrieve", json={"queries": ["a", "b"]}), scaled(10))
        assert resp.status == 200 and (await client.get("/health")).status == 200
    finally:
        await client.close()


async def test_a_dead_batcher_fails_requests_fast_with_503_and_health_says_why(monkeypatch):
    client = await _client(EchoRetriever(), cache_size=0)
    try:
        assert (await client.post("/retrieve", json={"queries": ["a"]})).status == 200
        batcher = client.server.app[STATE_KEY].dispatcher

        def broken() -> int:  # stands in for a bug in the loop itself (outside any one batch)
            raise RuntimeError("loop bug")

        monkeypatch.setattr(batcher, "_queued", broken)
        monkeypatch.setattr(
            batcher, "window_s", 0.001
        )  # the loop reads `_queued` while it waits out a window
        for _ in range(2):  # the request the loop died on, then one after
            resp = await asyncio.wait_for(client.post("/retrieve", json={"queries": ["b"]}), scaled(10))
            assert resp.status == 503 and "loop bug" in (await resp.json())["error"]
        health = await client.get("/health")
        assert health.status == 503
        assert (await health.json()) == {
            "status": "failed",
            "error": "the retrieval batcher stopped: RuntimeError: loop bug",
        }
    finally:
        await client.close()


@pytest.mark.parametrize("token", ["", "two words", "caf\u00e9"])
def test_a_token_no_client_could_send_is_refused(token):
    with pytest.raises(ValueError, match="retrieval.token|token") as caught:
        RetrievalConfig(token=token)
    assert ("omit it" in str(caught.value)) == (token == "")
