"""Online search engines (Google Programmable Search, Bing Web Search, Brave Search, SerpAPI) as retrievers.

Each adapter calls its vendor's JSON API and returns documents in the corpus shape, `{"id": url, "contents":
"\"Title\"\\nsnippet"}`, scored 1/rank, so the server answers exactly as for BM25 or dense. Keys come from the
environment (`GOOGLE_API_KEY` + `GOOGLE_CSE_ID`, `BING_API_KEY`, `BRAVE_API_KEY`, `SERPAPI_API_KEY`, or
`retrieval.retriever.api_key_env`); `retrieval.retriever.base_url` points an adapter elsewhere (the tests use
loopback fakes that answer with the vendors' response layouts). Each engine is a class here beside its member of the
retriever union (`retrieval.retriever: {method: brave}`). An empty or whitespace-only query is not sent to the
vendor (web search APIs refuse it): it gets no documents.
"""

from __future__ import annotations

import asyncio
import html
import os
import re
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from retrieval.base import Hits
from retrieval.corpus import join_contents
from retrieval.union import RetrieverSettings

if TYPE_CHECKING:
    import aiohttp

_TAG = re.compile(r"<[^>]+>")


class OnlineSettings(RetrieverSettings):
    """A web search API (no corpus, no server process of sr1's own). Keys come from the environment, never from
    config files."""

    local = False
    engine: ClassVar[type[OnlineEngine]]  # the adapter `build()` makes

    base_url: str | None = Field(
        None, description="Override the vendor endpoint (tests point it at a loopback fake)."
    )
    api_key_env: str | None = Field(
        None,
        description="Env var holding the key; None: GOOGLE_API_KEY, BING_API_KEY, BRAVE_API_KEY or SERPAPI_API_KEY.",
    )
    timeout_s: float = Field(10.0, gt=0, description="Per-call timeout to the vendor.")
    concurrency: int = Field(16, ge=1, description="Vendor calls in flight at once.")

    def build(self, show_progress: bool = False) -> OnlineEngine:
        return self.engine(self)


class OnlineSearchError(RuntimeError):
    """The vendor could not answer (HTTP error, quota, bad key); the server turns it into a JSON 502."""


def _clean(text: str | None) -> str:
    return html.unescape(_TAG.sub("", text or "")).strip()


class OnlineEngine:
    """Base adapter: one aiohttp session, bounded concurrency, one vendor call per query."""

    name = "online"
    default_base = ""
    default_key_env = ""
    max_per_call = 10

    def __init__(self, cfg: OnlineSettings):
        self.cfg = cfg
        self.base_url = (cfg.base_url or self.default_base).rstrip("/")
        key_env = cfg.api_key_env or self.default_key_env
        self.api_key = os.environ.get(key_env, "")
        if not self.api_key:
            raise ValueError(
                f"retrieval.retriever.method={self.name!r} needs an API key in the environment variable {key_env}"
            )
        self._session: aiohttp.ClientSession | None = None
        self._sem: asyncio.Semaphore | None = None
        self.store = None

    # -- vendor specifics ------------------------------------------------------------------------------------
    def request(self, query: str, topk: int) -> tuple[str, dict[str, Any], dict[str, str]]:
        """(url, params, headers) of the vendor call."""
        raise NotImplementedError

    def parse(self, answer: dict[str, Any]) -> list[tuple[str, str, str]]:
        """(url, title, snippet) per result, in the vendor's rank order."""
        raise NotImplementedError

    # -- the retriever protocol --------------------------------------------------------------------------------
    async def _one(self, query: str, topk: int) -> Hits:
        assert self._session is not None and self._sem is not None
        if not query.strip():
            return Hits()
        url, params, headers = self.request(query, min(topk, self.max_per_call))
        async with self._sem, self._session.get(url, params=params, headers=headers) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise OnlineSearchError(f"{self.name} answered HTTP {resp.status}: {text[:200]}")
            try:
                answer = await resp.json(content_type=None)
            except ValueError:
                raise OnlineSearchError(f"{self.name} answered with invalid JSON") from None
        if isinstance(answer, dict) and answer.get("error"):
            raise OnlineSearchError(f"{self.name} error: {str(answer['error'])[:200]}")
        results = self.parse(answer)[:topk]
        docs = [
            {"id": link, "contents": join_contents(_clean(title), _clean(snippet))}
            for link, title, snippet in results
        ]
        return Hits(docs, [1.0 / (i + 1) for i in range(len(docs))])

    async def asearch(self, queries: list[str], topk: int, executor: Executor | None = None) -> list[Hits]:
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.cfg.timeout_s))
            self._sem = asyncio.Semaphore(self.cfg.concurrency)
        try:
            return list(await asyncio.gather(*(self._one(q, topk) for q in queries)))
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise OnlineSearchError(f"{self.name} unreachable: {type(exc).__name__}: {exc}") from None

    def search(self, queries: list[str], topk: int) -> list[Hits]:
        """Blocking variant for scripts (not for use inside a running event loop)."""

        async def go() -> list[Hits]:
            try:
                return await self.asearch(queries, topk)
            finally:
                await self.aclose()

        return asyncio.run(go())

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def close(self) -> None:
        pass  # the server awaits `aclose`


class GoogleEngine(OnlineEngine):
    """Google Programmable Search (Custom Search JSON API): `items[].{title, link, snippet}`."""

    name = "google"
    default_base = "https://www.googleapis.com"
    default_key_env = "GOOGLE_API_KEY"

    def __init__(self, cfg: GoogleSettings):
        super().__init__(cfg)
        self.cx = os.environ.get(cfg.cx_env, "")
        if not self.cx:
            raise ValueError(
                f"retrieval.retriever.method='google' needs the search engine id (cx) in {cfg.cx_env}"
            )

    def request(self, query: str, topk: int) -> tuple[str, dict[str, Any], dict[str, str]]:
        return (
            f"{self.base_url}/customsearch/v1",
            {"key": self.api_key, "cx": self.cx, "q": query, "num": topk},
            {},
        )

    def parse(self, answer: dict[str, Any]) -> list[tuple[str, str, str]]:
        return [
            (i.get("link", ""), i.get("title", ""), i.get("snippet", "")) for i in answer.get("items", [])
        ]


class BingEngine(OnlineEngine):
    """Bing Web Search API v7: `webPages.value[].{name, url, snippet}`."""

    name = "bing"
    default_base = "https://api.bing.microsoft.com"
    default_key_env = "BING_API_KEY"
    max_per_call = 50

    def request(self, query: str, topk: int) -> tuple[str, dict[str, Any], dict[str, str]]:
        return (
            f"{self.base_url}/v7.0/search",
            {"q": query, "count": topk, "responseFilter": "Webpages"},
            {"Ocp-Apim-Subscription-Key": self.api_key},
        )

    def parse(self, answer: dict[str, Any]) -> list[tuple[str, str, str]]:
        pages = answer.get("webPages", {}).get("value", [])
        return [(p.get("url", ""), p.get("name", ""), p.get("snippet", "")) for p in pages]


class BraveEngine(OnlineEngine):
    """Brave Search API: `web.results[].{title, url, description}` (descriptions carry <strong> tags)."""

    name = "brave"
    default_base = "https://api.search.brave.com"
    default_key_env = "BRAVE_API_KEY"
    max_per_call = 20

    def request(self, query: str, topk: int) -> tuple[str, dict[str, Any], dict[str, str]]:
        return (
            f"{self.base_url}/res/v1/web/search",
            {"q": query, "count": topk},
            {"X-Subscription-Token": self.api_key, "Accept": "application/json"},
        )

    def parse(self, answer: dict[str, Any]) -> list[tuple[str, str, str]]:
        results = answer.get("web", {}).get("results", [])
        return [(r.get("url", ""), r.get("title", ""), r.get("description", "")) for r in results]


class SerpApiEngine(OnlineEngine):
    """SerpAPI (Google engine): `organic_results[].{position, title, link, snippet}`."""

    name = "serpapi"
    default_base = "https://serpapi.com"
    default_key_env = "SERPAPI_API_KEY"

    def request(self, query: str, topk: int) -> tuple[str, dict[str, Any], dict[str, str]]:
        return (
            f"{self.base_url}/search.json",
            {"engine": "google", "q": query, "num": topk, "api_key": self.api_key},
            {},
        )

    def parse(self, answer: dict[str, Any]) -> list[tuple[str, str, str]]:
        results = sorted(answer.get("organic_results", []), key=lambda r: r.get("position", 0))
        return [(r.get("link", ""), r.get("title", ""), r.get("snippet", "")) for r in results]


# -- their members of the retriever union (`retrieval/union.py`) ---------------------------------------------------
class GoogleSettings(OnlineSettings):
    """Google Programmable Search: GOOGLE_API_KEY and the search engine id in GOOGLE_CSE_ID."""

    engine = GoogleEngine

    method: Literal["google"] = Field("google", description="Which retriever (the union's tag).")
    cx_env: str = Field(
        "GOOGLE_CSE_ID", description="Env var holding the Google Programmable Search id (cx)."
    )


class BingSettings(OnlineSettings):
    """Bing Web Search API v7: BING_API_KEY."""

    engine = BingEngine

    method: Literal["bing"] = Field("bing", description="Which retriever (the union's tag).")


class BraveSettings(OnlineSettings):
    """Brave Search API: BRAVE_API_KEY."""

    engine = BraveEngine

    method: Literal["brave"] = Field("brave", description="Which retriever (the union's tag).")


class SerpApiSettings(OnlineSettings):
    """SerpAPI's Google engine: SERPAPI_API_KEY."""

    engine = SerpApiEngine

    method: Literal["serpapi"] = Field("serpapi", description="Which retriever (the union's tag).")
