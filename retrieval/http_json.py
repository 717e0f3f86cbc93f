"""One JSON-over-HTTP endpoint with timeouts, retries and failure reasons, shared by the search clients.

`retrieval/client.py` and `retrieval/rerank_client.py` call their servers through it.

    endpoint = JsonEndpoint("http://host:8000/retrieve", what="the retrieval server", timeout_s=10, max_retries=3)
    answer = await endpoint.call({"queries": [...]}, parse)     # parse(json) -> value, or raises BadAnswer
    # raises EndpointFailed(reason) once the attempts are spent or the answer cannot be used

One aiohttp session; every attempt has a timeout; connection errors, timeouts, 429, 5xx and invalid JSON are
retried with exponential backoff; 4xx and answers `parse` rejects are not (retrying will not fix them). Every
failure's reason names the endpoint and what went wrong.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, TypeVar

import aiohttp

from common.secrets import mask_text

T = TypeVar("T")


class BadAnswer(ValueError):
    """An answer of the wrong shape (raised by a `parse` function): not retried."""


class EndpointFailed(Exception):
    """The endpoint gave no usable answer: `reason` says why, `attempts` how many were made."""

    def __init__(self, reason: str, attempts: int):
        super().__init__(reason)
        self.reason = reason
        self.attempts = attempts


class _Retryable(Exception):
    """A failure worth another attempt (429, 5xx, invalid JSON)."""


class _Rejected(Exception):
    """A 4xx answer: the request itself is wrong."""


class JsonEndpoint:
    """POSTs JSON to `url` and parses the answer; safe to share between the tasks of one event loop.

    `what` names the endpoint in failure reasons ("the retrieval server", "the reranker"); `stats` (requests,
    retries, failures) is updated in place, so a client may pass its own dict."""

    def __init__(
        self,
        url: str,
        *,
        what: str,
        timeout_s: float = 10.0,
        max_retries: int = 3,
        backoff_s: float = 0.2,
        token: str | None = None,
        stats: dict[str, int] | None = None,
    ):
        self.url = url
        self.what = what
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.token = token
        self.stats = stats if stats is not None else {}
        for key in ("requests", "retries", "failures"):
            self.stats.setdefault(key, 0)
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            self._session = aiohttp.ClientSession(
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                connector=aiohttp.TCPConnector(limit=256),
            )
        return self._session

    async def call(self, payload: dict, parse: Callable[[Any], T]) -> T:
        """`parse` of the endpoint's JSON answer to `payload`; raises `EndpointFailed` when there is none."""
        reason = "no attempt made"
        attempt = 0
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.stats["retries"] += 1
                await asyncio.sleep(self.backoff_s * (2 ** (attempt - 1)))
            self.stats["requests"] += 1
            try:
                return parse(await self._attempt(payload))
            except _Retryable as exc:
                reason = str(exc)
            except asyncio.TimeoutError:
                reason = f"{self.what} did not answer within {self.timeout_s:g}s"
            except (aiohttp.ClientConnectionError, OSError) as exc:
                reason = f"cannot reach {self.what} at {self.url} ({type(exc).__name__})"
            except aiohttp.ClientError as exc:
                reason = f"the request to {self.what} failed ({type(exc).__name__}: {exc})"
            except (_Rejected, BadAnswer) as exc:
                reason = str(exc)
                break
        self.stats["failures"] += 1
        # the reason reaches logs and the model's observation: a URL's password or a token in it is masked
        raise EndpointFailed(mask_text(reason), attempt + 1)

    async def _attempt(self, payload: dict) -> Any:
        async with self._get_session().post(self.url, json=payload) as resp:
            text = await resp.text()
            if resp.status == 429 or resp.status >= 500:
                raise _Retryable(f"{self.what} answered HTTP {resp.status}: {error_reason(text)}")
            if resp.status != 200:
                raise _Rejected(
                    f"{self.what} rejected the request (HTTP {resp.status}): {error_reason(text)}"
                )
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                raise _Retryable(f"{self.what} answered with invalid JSON: {text[:80]!r}") from None

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


def error_reason(text: str) -> str:
    """The `error` of a JSON error body (sr1's servers), `detail` (FastAPI's), or the body's start."""
    try:
        obj = json.loads(text)
        if isinstance(obj, dict):
            for key in ("error", "detail"):
                if key in obj:
                    return str(obj[key])[:300]
    except json.JSONDecodeError:
        pass
    return text[:200]
