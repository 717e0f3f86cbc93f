"""Async client of the retrieval server, for the generators' agent loop.

One aiohttp session; every attempt has a timeout; connection errors, timeouts, 429 and 5xx are retried with
exponential backoff; identical queries in flight at the same time share one request (the n samples of a GRPO
group often search the same thing). `search` never raises for server or network failures: it returns a
`SearchResult` with `error` set, which the Search-R1 task (tasks/search_r1/protocol.py `format_documents`) turns
into an explicit "Search unavailable" line so the model sees why there is no information rather than an empty block.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import aiohttp

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


class _Retryable(Exception):
    """A failure worth another attempt (timeout, connection refused, 429, 5xx)."""


class _Fatal(Exception):
    """An answer that retrying will not fix (4xx, wrong shape)."""


class RetrievalClient:
    """Talks to `POST /retrieve`; safe to share between all agent tasks of a generator process."""

    def __init__(
        self,
        url: str,
        *,
        topk: int = 3,
        timeout_s: float = 10.0,
        max_retries: int = 3,
        backoff_s: float = 0.2,
        token: str | None = None,
    ):
        if not url.rstrip("/").endswith("/retrieve"):
            url = url.rstrip("/") + "/retrieve"
        self.url = url
        self.topk = topk
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.token = token
        self._session: aiohttp.ClientSession | None = None
        self._inflight: dict[tuple[str, int], asyncio.Task[SearchResult]] = {}
        self.stats = {"requests": 0, "shared": 0, "retries": 0, "failures": 0}

    @classmethod
    def from_config(cls, cfg: Any) -> RetrievalClient:
        """From a `RetrievalConfig` (its `url`, `topk`, `timeout_s`, `max_retries`, `backoff_s`, `token`)."""
        return cls(
            cfg.url,
            topk=cfg.topk,
            timeout_s=cfg.timeout_s,
            max_retries=cfg.max_retries,
            backoff_s=cfg.backoff_s,
            token=cfg.token,
        )

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            self._session = aiohttp.ClientSession(
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                connector=aiohttp.TCPConnector(limit=256),
            )
        return self._session

    async def search(self, query: str) -> SearchResult:
        """Documents for `query`; shares the request of an identical query already in flight."""
        key = (query, self.topk)
        task = self._inflight.get(key)
        if task is None:
            # the request runs in its own task so that a cancelled caller does not cancel it for the others
            task = asyncio.get_running_loop().create_task(self._post_one(query))
            self._inflight[key] = task
            task.add_done_callback(lambda _t, key=key: self._inflight.pop(key, None))
        else:
            self.stats["shared"] += 1
        return await asyncio.shield(task)

    async def _post_one(self, query: str) -> SearchResult:
        return (await self._post([query]))[0]

    async def search_many(self, queries: list[str]) -> list[SearchResult]:
        """Search several queries concurrently (the server batches them); results in input order."""
        return list(await asyncio.gather(*(self.search(q) for q in queries)))

    async def _post(self, queries: list[str]) -> list[SearchResult]:
        payload = {"queries": queries, "topk": self.topk, "return_scores": True}
        last_error = "no attempt made"
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.stats["retries"] += 1
                await asyncio.sleep(self.backoff_s * (2 ** (attempt - 1)))
            self.stats["requests"] += 1
            try:
                return self._parse(queries, await self._attempt(payload))
            except _Retryable as exc:
                last_error = str(exc)
            except asyncio.TimeoutError:
                last_error = f"the retrieval server did not answer within {self.timeout_s:g}s"
            except (aiohttp.ClientConnectionError, OSError) as exc:
                last_error = f"cannot reach the retrieval server at {self.url} ({type(exc).__name__})"
            except aiohttp.ClientError as exc:
                last_error = f"retrieval request failed ({type(exc).__name__}: {exc})"
            except _Fatal as exc:
                last_error = str(exc)
                break
        self.stats["failures"] += 1
        log.warning(
            "retrieval failed for %d query(ies) after %d attempt(s): %s",
            len(queries),
            attempt + 1,
            last_error,
        )
        return [SearchResult(query=q, error=last_error) for q in queries]

    async def _attempt(self, payload: dict) -> Any:
        async with self._get_session().post(self.url, json=payload) as resp:
            text = await resp.text()
            if resp.status == 429 or resp.status >= 500:
                raise _Retryable(f"retrieval server answered HTTP {resp.status}: {_reason(text)}")
            if resp.status != 200:
                raise _Fatal(f"retrieval server rejected the request (HTTP {resp.status}): {_reason(text)}")
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                raise _Retryable("retrieval server answered with invalid JSON") from None

    def _parse(self, queries: list[str], answer: Any) -> list[SearchResult]:
        result = answer.get("result") if isinstance(answer, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise _Fatal("retrieval server answer has no 'result' list with one entry per query")
        out = []
        for q, entries in zip(queries, result, strict=True):
            docs, scores = [], []
            for e in entries:
                doc = e.get("document", e) if isinstance(e, dict) else {}
                docs.append({"id": str(doc.get("id", "")), "contents": str(doc.get("contents", ""))})
                scores.append(float(e.get("score", 0.0)) if isinstance(e, dict) else 0.0)
            out.append(SearchResult(query=q, documents=docs, scores=scores))
        return out

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> RetrievalClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _reason(text: str) -> str:
    try:
        obj = json.loads(text)
        if isinstance(obj, dict) and "error" in obj:
            return str(obj["error"])
    except json.JSONDecodeError:
        pass
    return text[:200]
