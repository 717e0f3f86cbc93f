"""Cross-request micro-batching: many concurrent searches, one batched retriever call.

Many concurrent `/retrieve` requests are coalesced into one call of the retriever's batched search (one encoder
forward and one faiss/BM25 search): the first request opens a short window (`batch_window_ms`), and while a batch
is being searched new requests queue up and form the next batch, so under load batches grow by themselves up to
`max_batch_queries`. Identical queries in a batch are searched once. Requests with different topk are searched in
separate groups, because top-k with ties is not a prefix of top-(k+1): results equal unbatched search exactly.

The batching loop never ends silently: a failure of one batch (the retriever raising, or answering the wrong number
of results) fails that batch's requests, and should the loop itself die (a bug), `failure` says why, every waiting
request and every later one gets `BatcherStopped` at once (the server answers 503 and reports it on /health).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

from retrieval.base import Hits, Retriever

log = logging.getLogger(__name__)


class BatcherStopped(RuntimeError):
    """The batching loop has died: no request will be searched by this server again."""


@dataclass
class _Pending:
    queries: list[str]
    topk: int
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


@dataclass
class BatchStats:
    batches: int = 0
    batched_queries: int = 0
    searched_queries: int = 0
    max_batch: int = 0


class MicroBatcher:
    """Coalesces concurrent `submit` calls into batched `retriever.asearch` calls, one batch at a time."""

    def __init__(self, retriever: Retriever, window_s: float = 0.002, max_queries: int = 512):
        self.retriever = retriever
        self.window_s = window_s
        self.max_queries = max_queries
        # one search thread: the backends are internally parallel, and batches must not interleave
        self.executor: Executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retrieval-search")
        self._pending: list[_Pending] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.stats = BatchStats()
        self.failure: str | None = None  # why the batching loop died (None while it runs)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="retrieval-batcher")
            self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        """The loop ended: on a stop, nothing to do; on a crash, say why and fail every request waiting for it."""
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        self.failure = f"the retrieval batcher stopped: {type(error).__name__}: {error}"
        log.error("%s; this server answers 503 from now on", self.failure, exc_info=error)
        self._fail_pending(BatcherStopped(self.failure))

    def _fail_pending(self, error: Exception) -> None:
        for p in self._pending:
            if not p.future.done():
                p.future.set_exception(error)
        self._pending.clear()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():  # a loop that died has said why already (`_ended`)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._fail_pending(RuntimeError("retrieval server shutting down"))
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, queries: list[str], topk: int) -> list[Hits]:
        if not queries:
            return []
        if self.failure is not None:
            raise BatcherStopped(self.failure)
        self.start()
        fut = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(queries, topk, fut))
        self._wakeup.set()
        return await fut

    def _queued(self) -> int:
        return sum(len(p.queries) for p in self._pending)

    async def _run(self) -> None:
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            # let requests that arrived in the same loop tick join, then (optionally) wait out a short window;
            # under load no window is needed: requests pile up while the previous batch is being searched
            await asyncio.sleep(0)
            deadline = self._pending[0].enqueued + self.window_s
            while self.window_s > 0 and self._queued() < self.max_queries:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), timeout=left)
                except asyncio.TimeoutError:
                    break
            batch, n = [], 0
            while self._pending and (not batch or n + len(self._pending[0].queries) <= self.max_queries):
                item = self._pending.pop(0)
                batch.append(item)
                n += len(item.queries)
            try:
                await self._search(batch)
            except Exception as exc:  # noqa: BLE001 - a bug in one batch fails its requests, not the loop
                log.exception("a retrieval batch failed")
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)

    async def _search(self, batch: list[_Pending]) -> None:
        by_topk: dict[int, list[_Pending]] = {}
        for item in batch:
            by_topk.setdefault(item.topk, []).append(item)
        self.stats.batches += 1
        self.stats.batched_queries += sum(len(p.queries) for p in batch)
        self.stats.max_batch = max(self.stats.max_batch, sum(len(p.queries) for p in batch))
        for topk, items in by_topk.items():
            unique = list(dict.fromkeys(q for item in items for q in item.queries))
            self.stats.searched_queries += len(unique)
            try:
                hits = await self.retriever.asearch(unique, topk, self.executor)
                if len(hits) != len(unique):
                    raise RuntimeError(
                        f"the retriever answered {len(unique)} queries with {len(hits)} results"
                    )
            except Exception as exc:  # noqa: BLE001 - delivered to every waiting request as a 500
                for item in items:
                    if not item.future.done():
                        item.future.set_exception(exc)
                continue
            found = dict(zip(unique, hits, strict=True))
            for item in items:
                if not item.future.done():
                    item.future.set_result([found[q] for q in item.queries])


class NaiveDispatcher:
    """The baseline the benchmark compares against: each request searched on its own in a thread pool
    (how a synchronous web framework serves a retriever). Same interface as `MicroBatcher`."""

    def __init__(self, retriever: Retriever, threads: int = 40):
        self.retriever = retriever
        self.executor: Executor = ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="retrieval-naive"
        )
        self.stats = BatchStats()

    def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, queries: list[str], topk: int) -> list[Hits]:
        if not queries:
            return []
        self.stats.batches += 1
        self.stats.batched_queries += len(queries)
        self.stats.searched_queries += len(queries)
        return await self.retriever.asearch(queries, topk, self.executor)
