"""Async client of the retrieval server, for the generators' agent loop.

One aiohttp session; every attempt has a timeout; connection errors, timeouts, 429 and 5xx are retried with
exponential backoff (`retrieval/http_json.py`); identical queries in flight at the same time share one request (the n
samples of a GRPO group often search the same thing). `search` never raises for server or network failures: it returns
a `SearchResult` with `error` set, which the Search-R1 task (tasks/search_r1/protocol.py `format_documents`) turns
into an explicit "Search unavailable" line so the model sees why there is no information rather than an empty block.

With a remote reranker (`retrieval.reranker.url`, `retrieval/rerank_client.py`) a search asks `/retrieve` for
`retrieval.reranker.candidates` documents and keeps the best `retrieval.topk` in the reranker's order; a reranker
that fails makes the search fail the same way.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from retrieval.http_json import BadAnswer, EndpointFailed, JsonEndpoint
from retrieval.rerank_client import RemoteReranker

log = logging.getLogger(__name__)


@dataclass
class SearchResult:
    """One query's documents in rank order, or the reason there are none."""

    query: str
    documents: list[dict] = field(default_factory=list)  # [{"id": str, "contents": str}, ...]
    scores: list[float] = field(default_factory=list)
    error: str | None = None  # set when the server could not be reached / answered an error after retries

    @property
    def ok(self) -> bool:
        return self.error is None


class RetrievalClient:
    """Talks to `POST /retrieve` (and a remote reranker, when given); safe to share between all agent tasks of a
    generator process. `topk`: the documents a search returns; with a `reranker`, /retrieve is asked for
    `candidates` and the reranker keeps `topk` of them."""

    def __init__(
        self,
        url: str,
        *,
        topk: int = 3,
        timeout_s: float = 10.0,
        max_retries: int = 3,
        backoff_s: float = 0.2,
        token: str | None = None,
        reranker: RemoteReranker | None = None,
        candidates: int | None = None,
    ):
        if not url.rstrip("/").endswith("/retrieve"):
            url = url.rstrip("/") + "/retrieve"
        self.url = url
        self.topk = topk
        self.reranker = reranker
        self.retrieve_topk = max(topk, candidates or topk) if reranker is not None else topk
        self.stats = {"requests": 0, "shared": 0, "retries": 0, "failures": 0}
        self.endpoint = JsonEndpoint(
            url,
            what="the retrieval server",
            timeout_s=timeout_s,
            max_retries=max_retries,
            backoff_s=backoff_s,
            token=token,
            stats=self.stats,
        )
        self._inflight: dict[tuple[str, int], asyncio.Task[SearchResult]] = {}

    @classmethod
    def from_config(cls, cfg: Any) -> RetrievalClient:
        """From a `RetrievalConfig` (its `client` section, `topk` and `token`; with `reranker.enabled` and
        `reranker.url`, the remote reranker there and `reranker.candidates`)."""
        client = cfg.client
        timing = {
            "timeout_s": client.timeout_s,
            "max_retries": client.max_retries,
            "backoff_s": client.backoff_s,
        }
        remote = cfg.reranker.enabled and cfg.reranker.url is not None
        return cls(
            client.url,
            topk=cfg.topk,
            token=cfg.token,
            reranker=RemoteReranker(cfg.reranker.url, token=cfg.token, **timing) if remote else None,
            candidates=cfg.reranker.candidates if remote else None,
            **timing,
        )

    async def search(self, query: str) -> SearchResult:
        """Documents for `query`; shares the request of an identical query already in flight."""
        key = (query, self.topk)
        task = self._inflight.get(key)
        if task is None:
            # the request runs in its own task so that a cancelled caller does not cancel it for the others
            task = asyncio.get_running_loop().create_task(self._search_one(query))
            self._inflight[key] = task
            task.add_done_callback(lambda _t, key=key: self._inflight.pop(key, None))
        else:
            self.stats["shared"] += 1
        return await asyncio.shield(task)

    async def _search_one(self, query: str) -> SearchResult:
        result = (await self._post([query]))[0]
        if self.reranker is None or not result.ok or not result.documents:
            return result
        try:
            docs, scores = await self.reranker.rerank(query, result.documents, self.topk)
        except EndpointFailed as exc:
            log.warning("reranking failed after %d attempt(s): %s", exc.attempts, exc.reason)
            return SearchResult(query=query, error=exc.reason)
        return SearchResult(query=query, documents=docs, scores=scores)

    async def search_many(self, queries: list[str]) -> list[SearchResult]:
        """Search several queries concurrently (the server batches them); results in input order."""
        return list(await asyncio.gather(*(self.search(q) for q in queries)))

    async def _post(self, queries: list[str]) -> list[SearchResult]:
        payload = {"queries": queries, "topk": self.retrieve_topk, "return_scores": True}
        try:
            return await self.endpoint.call(payload, lambda answer: _parse(queries, answer))
        except EndpointFailed as exc:
            log.warning(
                "retrieval failed for %d query(ies) after %d attempt(s): %s",
                len(queries),
                exc.attempts,
                exc.reason,
            )
            return [SearchResult(query=q, error=exc.reason) for q in queries]

    async def close(self) -> None:
        await self.endpoint.close()
        if self.reranker is not None:
            await self.reranker.close()

    async def __aenter__(self) -> RetrievalClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _parse(queries: list[str], answer: Any) -> list[SearchResult]:
    """A /retrieve answer as one `SearchResult` per query; `BadAnswer` naming what is wrong."""
    result = answer.get("result") if isinstance(answer, dict) else None
    if not isinstance(result, list) or len(result) != len(queries):
        raise BadAnswer("the retrieval server's answer has no 'result' list with one entry per query")
    out = []
    for i, (q, entries) in enumerate(zip(queries, result, strict=True)):
        if not isinstance(entries, list):
            raise BadAnswer(f"the retrieval server's result[{i}] is not a list of documents")
        docs, scores = [], []
        for e in entries:
            doc = e.get("document", e) if isinstance(e, dict) else {}
            score = e.get("score", 0.0) if isinstance(e, dict) else 0.0
            if not isinstance(doc, dict) or isinstance(score, bool) or not isinstance(score, int | float):
                raise BadAnswer(
                    f"the retrieval server's result[{i}] holds an entry that is not a document: {e!r:.120}"
                )
            docs.append({"id": str(doc.get("id", "")), "contents": str(doc.get("contents", ""))})
            scores.append(float(score))
        out.append(SearchResult(query=q, documents=docs, scores=scores))
    return out
