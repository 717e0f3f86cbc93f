"""Async client of a `/rerank` endpoint speaking Search-R1's rerank API: the generators' remote reranker.

The endpoint is Search-R1's own `rerank_server.py` (port 6980) or an sr1 retrieval server with a cross-encoder; the
wire format is `retrieval/rerank_api.py`.

    reranker = RemoteReranker("http://host:6980/rerank", timeout_s=10, max_retries=3)
    docs, scores = await reranker.rerank("capital of France", candidates, topk=3)   # EndpointFailed when it cannot

`RetrievalClient` (`retrieval/client.py`) uses it when `retrieval.reranker.url` is set: it asks `/retrieve` for
`retrieval.reranker.candidates` documents and keeps the best `retrieval.topk` of them by this endpoint's order, as
Search-R1's generation does with `reranker.do_rerank` (`retriever.topk` candidates, `reranker.topk` kept). One query
per request, so each query is scored against its own candidates on Search-R1's server too. Timeouts, retries and
failure reasons are the retrieval client's (`retrieval/http_json.py`).
"""

from __future__ import annotations

from retrieval.http_json import JsonEndpoint
from retrieval.rerank_api import parse_rerank_answer, rerank_request


class RemoteReranker:
    """Reranks one query's candidates at a `/rerank` URL; safe to share between the agent tasks of a process."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 10.0,
        max_retries: int = 3,
        backoff_s: float = 0.2,
        token: str | None = None,
    ):
        if not url.rstrip("/").endswith("/rerank"):
            url = url.rstrip("/") + "/rerank"
        self.url = url
        self.endpoint = JsonEndpoint(
            url,
            what="the reranker",
            timeout_s=timeout_s,
            max_retries=max_retries,
            backoff_s=backoff_s,
            token=token,
        )

    @property
    def stats(self) -> dict[str, int]:
        return self.endpoint.stats

    async def rerank(self, query: str, documents: list[dict], topk: int) -> tuple[list[dict], list[float]]:
        """The best `topk` of `documents` ({"id", "contents"}) for `query`, best first, with their scores; raises
        `retrieval.http_json.EndpointFailed` when the endpoint gives no usable answer."""
        return await self.endpoint.call(
            rerank_request(query, documents, topk),
            lambda answer: parse_rerank_answer(answer, documents, topk),
        )

    async def close(self) -> None:
        await self.endpoint.close()
