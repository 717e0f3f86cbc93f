"""The retriever protocol every search backend implements (BM25, dense, online engines), and what they answer.

A retriever answers a *batch* of queries at once; the server's micro-batcher relies on that to turn many
concurrent requests into one encode + one index search.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclass
class Hits:
    """One query's ranked documents ({"id", "contents"}) and their scores, best first."""

    docs: list[dict[str, str]] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)

    def truncate(self, k: int) -> Hits:
        return Hits(self.docs[:k], self.scores[:k])


def hits_from_rows(store: Any, ranked: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[Hits]:
    """Each query's (corpus rows, scores) arrays, best first, as `Hits`; every passage of the batch is read from
    `store` (a `DocStore`) in one `get_many` call."""
    docs = store.get_many([row for rows, _ in ranked for row in rows.tolist()])
    out, start = [], 0
    for rows, scores in ranked:
        out.append(Hits(docs[start : start + len(rows)], scores.tolist()))
        start += len(rows)
    return out


@runtime_checkable
class Retriever(Protocol):
    """A search backend. `search` is synchronous and batched; `asearch` is what the server awaits."""

    name: str

    def search(self, queries: list[str], topk: int) -> list[Hits]: ...

    async def asearch(
        self, queries: list[str], topk: int, executor: Executor | None = None
    ) -> list[Hits]: ...

    def close(self) -> None: ...


class LocalRetriever:
    """Base for CPU/GPU-bound retrievers: `asearch` runs the batched `search` in the given executor thread."""

    name = "local"

    def search(self, queries: list[str], topk: int) -> list[Hits]:
        raise NotImplementedError

    async def asearch(self, queries: list[str], topk: int, executor: Executor | None = None) -> list[Hits]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, self.search, queries, topk)

    def warmup(self) -> None:
        """Run one tiny search so JIT compilation / lazy loading happens before the first request."""
        self.search(["warm up"], 1)

    def close(self) -> None:
        pass
