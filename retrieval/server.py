"""The retrieval HTTP server: Search-R1's `/retrieve` API over aiohttp, with micro-batching, a cache and limits.

    POST /retrieve  {"queries": [str, ...], "topk": 3, "return_scores": true}
                 -> {"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}
                    (with "return_scores": false each entry is the bare document, as Search-R1's server meant)
    POST /rerank    {"queries": [...], "documents": [[doc, ...], ...], "rerank_topk": 3, "return_scores": true}
                 -> {"result": [[{"document": "(Title: T) text", "score": float}, ...], ...]}
                    Search-R1's rerank server's API (`retrieval/rerank_api.py`), served when the server has a
                    cross-encoder (`retrieval.reranker.enabled` with a `model`)
    GET  /health    {"status": "ok", "method", "num_docs", ...} once the index is loaded; 503 {"status": "failed",
                    "error"} should the batcher die (every /retrieve then answers 503 at once)
    GET  /metrics   JSON counters (`retrieval/requests`, `retrieval/batch_mean`, latency percentiles, ...)

Every bad request gets a JSON 4xx `{"error": "..."}` naming what was wrong; nothing a client sends can crash it.
Request fields of /retrieve other than those three are ignored, as Search-R1's server does, and counted in
`retrieval/unknown_fields`. Every query, an empty one included, is searched (see `retrieval/api.py`).
Run it with `sr1 retrieval serve ...` (its command line: `sr1/entrypoints/retrieval.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import signal
import time
from collections import deque
from typing import Any, Protocol

from aiohttp import web

from retrieval.api import RequestError, format_result, parse_retrieve_request
from retrieval.base import Hits, Retriever
from retrieval.batcher import BatcherStopped, MicroBatcher, NaiveDispatcher
from retrieval.cache import ResultCache
from retrieval.factory import build_reranker, load_retriever
from retrieval.online import OnlineSearchError
from retrieval.rerank_api import format_rerank_result, parse_rerank_request
from retrieval.settings import RetrievalConfig

log = logging.getLogger(__name__)

RETRIEVER_KEY = web.AppKey("retriever", object)
RERANKER_KEY = web.AppKey("reranker", object)
STATE_KEY = web.AppKey("state", object)
SHARE_TASK_KEY = web.AppKey("share_counters", asyncio.Task)
MAX_LOGGED_UNKNOWN_FIELDS = 64  # distinct ignored field names a worker logs (once each)


# Counters a worker reports; with several workers (`retrieval.server.workers`) /metrics sums them across the pool,
# except the MAX_COUNTERS, where the pool reports its worst worker.
ERROR_CODES = (400, 401, 404, 405, 413, 415, 500, 502, 503)
SUMMED_COUNTERS = (
    "requests",
    "queries",
    "batches",
    "batched_queries",
    "searched_queries",
    "cache_hits",
    "cache_misses",
    "cache_entries",
    "cache_bytes",
    "unknown_fields",
    "rerank_requests",
    "reranked_queries",
    *(f"errors_{code}" for code in ERROR_CODES),
    "errors_other",
)
MAX_COUNTERS = ("batch_max", "latency_p50_ms", "latency_p99_ms", "uptime_s")
COUNTER_KEYS = SUMMED_COUNTERS + MAX_COUNTERS


def merge_counters(parts: list[dict[str, float]]) -> dict[str, float]:
    """One pool-wide set of counters from each worker's."""
    merged = {k: sum(p[k] for p in parts) for k in SUMMED_COUNTERS}
    merged.update({k: max(p[k] for p in parts) for k in MAX_COUNTERS})
    return merged


class PeerCounters(Protocol):
    """Where a worker of a multi-process server shares its counters (`retrieval.pool.SharedCounters`)."""

    workers: int

    def read(self, slot: int) -> dict[str, float]: ...

    def exchange(self, slot: int, own: dict[str, float]) -> list[dict[str, float]]: ...


class ServerState:
    """Batcher, cache and counters of one running server (one worker of the pool when `peers` is given)."""

    def __init__(
        self, retriever: Retriever, cfg: RetrievalConfig, peers: PeerCounters | None = None, slot: int = 0
    ):
        self.cfg = cfg
        self.retriever = retriever
        server = cfg.server
        if server.batching:
            self.dispatcher: MicroBatcher | NaiveDispatcher = MicroBatcher(
                retriever, window_s=server.batch_window_ms / 1000.0, max_queries=server.max_batch_queries
            )
        else:
            self.dispatcher = NaiveDispatcher(retriever)
        self.cache = ResultCache(server.cache_size, int(server.cache_mb * (1 << 20)))
        self.ready = True
        self.started = time.time()
        self.requests = 0
        self.queries = 0
        self.errors: dict[int, int] = {}
        self.unknown_fields = 0  # request fields ignored (not queries/topk/return_scores)
        self.rerank_requests = 0
        self.reranked_queries = 0
        self.logged_fields: set[str] = set()
        self.latencies: deque[float] = deque(maxlen=4096)
        self.peers, self.slot = peers, slot
        # a restarted worker carries on from the counts its predecessor left in the shared slot
        self.carried = peers.read(slot) if peers is not None else dict.fromkeys(COUNTER_KEYS, 0.0)

    async def retrieve(self, queries: list[str], topk: int) -> list[Hits]:
        results: list[Hits | None] = [None] * len(queries)
        missing: list[int] = []
        # an empty query is searched too: Search-R1's server answers it with top-k documents
        for i, q in enumerate(queries):
            cached = self.cache.get((q, topk))
            if cached is None:
                missing.append(i)
            else:
                results[i] = cached
        if missing:
            try:
                found = await self.dispatcher.submit([queries[i] for i in missing], topk)
            except BatcherStopped as err:
                raise RequestError(503, str(err)) from None
            for i, h in zip(missing, found, strict=True):
                results[i] = h
                self.cache.put((queries[i], topk), h)
        return results  # type: ignore[return-value]

    def count_unknown_fields(self, names: list[str]) -> None:
        """Count request fields the API ignores; the first time a name is seen it is logged (a client sending
        `top_k` gets the default topk, as with Search-R1's server)."""
        self.unknown_fields += len(names)
        for name in names:
            if name not in self.logged_fields and len(self.logged_fields) < MAX_LOGGED_UNKNOWN_FIELDS:
                self.logged_fields.add(name)
                log.warning(
                    "ignoring unknown /retrieve field %r (known: queries, topk, return_scores)", name[:80]
                )

    def counters(self) -> dict[str, float]:
        """This worker's counters (`COUNTER_KEYS`), including what a predecessor in its slot counted."""
        lat = sorted(self.latencies)

        def pct(p: float) -> float:
            return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else 0.0

        s = self.dispatcher.stats
        own: dict[str, float] = {
            "requests": self.requests,
            "queries": self.queries,
            "batches": s.batches,
            "batched_queries": s.batched_queries,
            "searched_queries": s.searched_queries,
            "cache_hits": self.cache.hits,
            "cache_misses": self.cache.misses,
            "cache_entries": len(self.cache),
            "cache_bytes": self.cache.bytes,
            "unknown_fields": self.unknown_fields,
            "rerank_requests": self.rerank_requests,
            "reranked_queries": self.reranked_queries,
            **{f"errors_{code}": self.errors.get(code, 0) for code in ERROR_CODES},
            "errors_other": sum(n for code, n in self.errors.items() if code not in ERROR_CODES),
            "batch_max": s.max_batch,
            "latency_p50_ms": pct(0.5),
            "latency_p99_ms": pct(0.99),
            "uptime_s": time.time() - self.started,
        }
        for k in SUMMED_COUNTERS:
            own[k] += self.carried[k] if k not in ("cache_entries", "cache_bytes") else 0
        own["batch_max"] = max(own["batch_max"], self.carried["batch_max"])
        return own

    def publish_counters(self) -> None:
        if self.peers is not None:
            self.peers.exchange(self.slot, self.counters())

    def metrics(self) -> dict[str, Any]:
        """The /metrics answer: this server's counters, or the whole pool's when it has several workers."""
        own = self.counters()
        parts = [own] if self.peers is None else self.peers.exchange(self.slot, own)
        c = merge_counters(parts)
        errors = {str(code): int(c[f"errors_{code}"]) for code in ERROR_CODES if c[f"errors_{code}"]}
        if c["errors_other"]:
            errors["other"] = int(c["errors_other"])
        return {
            "retrieval/workers": len(parts),
            "retrieval/worker_requests": [int(p["requests"]) for p in parts],
            "retrieval/requests": int(c["requests"]),
            "retrieval/queries": int(c["queries"]),
            "retrieval/batches": int(c["batches"]),
            "retrieval/batch_mean": c["batched_queries"] / c["batches"] if c["batches"] else 0.0,
            "retrieval/batch_max": int(c["batch_max"]),
            "retrieval/searched_queries": int(c["searched_queries"]),
            "retrieval/cache_hits": int(c["cache_hits"]),
            "retrieval/cache_misses": int(c["cache_misses"]),
            "retrieval/cache_entries": int(c["cache_entries"]),
            "retrieval/cache_mb": c["cache_bytes"] / (1 << 20),
            "retrieval/unknown_fields": int(c["unknown_fields"]),
            "retrieval/rerank_requests": int(c["rerank_requests"]),
            "retrieval/reranked_queries": int(c["reranked_queries"]),
            "retrieval/errors": errors,
            "retrieval/latency_p50_ms": c["latency_p50_ms"],
            "retrieval/latency_p99_ms": c["latency_p99_ms"],
            "retrieval/uptime_s": c["uptime_s"],
        }


def _json_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def _errors_as_json(request: web.Request, handler: Any) -> web.StreamResponse:
    state: ServerState = request.app[STATE_KEY]
    try:
        return await handler(request)
    except RequestError as exc:
        state.errors[exc.status] = state.errors.get(exc.status, 0) + 1
        return _json_error(exc.status, exc.message)
    except OnlineSearchError as exc:  # the web search vendor failed, not us: a gateway error
        state.errors[502] = state.errors.get(502, 0) + 1
        return _json_error(502, str(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        state.errors[exc.status] = state.errors.get(exc.status, 0) + 1
        if exc.status in (404, 405):
            return _json_error(
                exc.status,
                f"no route {request.method} {request.path}; use POST /retrieve, POST /rerank, GET /health, "
                "GET /metrics",
            )
        return _json_error(exc.status, exc.reason or "error")
    except Exception as exc:  # noqa: BLE001 - a server bug must answer 500, not kill the connection silently
        log.exception("retrieval request failed")
        state.errors[500] = state.errors.get(500, 0) + 1
        return _json_error(500, f"internal error: {type(exc).__name__}: {exc}")


async def _read_body(request: web.Request, cfg: RetrievalConfig) -> bytes:
    """The body of an authorised request within `max_body_bytes`; `RequestError` otherwise."""
    if cfg.token is not None:
        # aiohttp keeps a header's bytes that are not UTF-8 as surrogates: compared as the bytes sent, so such a header
        # is a plain 401 (encoding it strictly raised: a 500 and a logged traceback per request)
        auth = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(auth, f"Bearer {cfg.token}".encode()):
            raise RequestError(401, "missing or wrong bearer token (send 'Authorization: Bearer <token>')")
    limit = cfg.server.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise RequestError(413, f"request body of {request.content_length} bytes > max_body_bytes ({limit})")
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise RequestError(413, f"request body larger than max_body_bytes ({limit})") from None


async def _retrieve(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE_KEY]
    cfg = state.cfg
    body = await _read_body(request, cfg)
    t0 = time.perf_counter()
    ignored: list[str] = []
    queries, topk, return_scores = parse_retrieve_request(body, cfg, ignored)
    if ignored:
        state.count_unknown_fields(ignored)
    hits = await state.retrieve(queries, topk)
    state.requests += 1
    state.queries += len(queries)
    state.latencies.append(time.perf_counter() - t0)
    return web.Response(text=json.dumps(format_result(hits, return_scores)), content_type="application/json")


async def _rerank(request: web.Request) -> web.Response:
    """Search-R1's /rerank: each query's own documents re-ordered by the server's cross-encoder."""
    state: ServerState = request.app[STATE_KEY]
    reranker = request.app[RERANKER_KEY]
    body = await _read_body(request, state.cfg)
    if reranker is None:
        raise RequestError(
            404,
            "this server has no reranker: start it with retrieval.reranker.enabled=true and "
            "retrieval.reranker.model=<an HF cross-encoder> to serve POST /rerank",
        )
    queries, documents, topk, return_scores = parse_rerank_request(body, state.cfg)
    candidates = [Hits(docs, [0.0] * len(docs)) for docs in documents]
    loop = asyncio.get_running_loop()
    ranked = await loop.run_in_executor(None, reranker.rerank, queries, candidates, topk)
    state.rerank_requests += 1
    state.reranked_queries += len(queries)
    answer = format_rerank_result([(h.docs, h.scores) for h in ranked], return_scores)
    return web.Response(text=json.dumps(answer), content_type="application/json")


async def _health(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE_KEY]
    failure = getattr(state.dispatcher, "failure", None)
    if failure is not None:
        return web.json_response({"status": "failed", "error": failure}, status=503)
    store = getattr(state.retriever, "store", None)
    return web.json_response(
        {
            "status": "ok",
            "method": state.cfg.retriever.method,
            "num_docs": len(store) if store is not None else None,
            "topk": state.cfg.topk,
            "batching": state.cfg.server.batching,
            "rerank": request.app[RERANKER_KEY] is not None,
            "workers": state.peers.workers if state.peers is not None else 1,
        }
    )


async def _metrics(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE_KEY].metrics())


def create_app(
    retriever: Retriever,
    cfg: RetrievalConfig,
    peers: PeerCounters | None = None,
    slot: int = 0,
    reranker: Any = None,
) -> web.Application:
    """The aiohttp application serving `retriever` (already loaded) under `cfg`'s limits; `peers`/`slot` make it
    worker `slot` of a multi-process server. `reranker` (a `retrieval.reranker.CrossEncoderReranker`) answers
    POST /rerank; by default the one behind `retriever` when it reranks its searches."""
    # aiohttp's own body limit is set above ours so the handler can answer with a JSON 413
    app = web.Application(middlewares=[_errors_as_json], client_max_size=cfg.server.max_body_bytes + 1)
    state = ServerState(retriever, cfg, peers, slot)
    app[STATE_KEY] = state
    app[RETRIEVER_KEY] = retriever
    app[RERANKER_KEY] = reranker if reranker is not None else getattr(retriever, "reranker", None)
    app.router.add_post("/retrieve", _retrieve)
    app.router.add_post("/rerank", _rerank)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)

    # so /metrics on any worker sees the others' counts (half a second old)
    async def _share_counters() -> None:
        while True:
            await asyncio.sleep(0.5)
            state.publish_counters()

    async def _start(app: web.Application) -> None:
        state.dispatcher.start()
        if peers is not None:
            app[SHARE_TASK_KEY] = asyncio.get_running_loop().create_task(_share_counters())

    async def _stop(app: web.Application) -> None:
        if SHARE_TASK_KEY in app:
            app[SHARE_TASK_KEY].cancel()
            state.publish_counters()
        await state.dispatcher.stop()
        aclose = getattr(retriever, "aclose", None)
        if aclose is not None:
            await aclose()
        retriever.close()

    app.on_startup.append(_start)
    app.on_cleanup.append(_stop)
    return app


class Companion(Protocol):
    """Runs next to a worker of a multi-process server: the pool's supervisor in the first worker, a watch on the
    parent in the others (`retrieval.pool`)."""

    async def ready(self) -> None:
        """Return once the server may announce itself (the other workers are listening too)."""

    async def run(self, stop: asyncio.Event) -> None:
        """Run until cancelled; set `stop` to shut the server down."""


async def serve(
    retriever: Retriever,
    cfg: RetrievalConfig,
    ready_line: bool = True,
    *,
    peers: PeerCounters | None = None,
    slot: int = 0,
    companion: Companion | None = None,
    reranker: Any = None,
) -> None:
    """Serve until cancelled, SIGTERM, or the companion sets the stop event.

    Prints `retrieval server listening on http://HOST:PORT` once bound. As a worker of a multi-process server
    (`peers` given) the socket is bound with SO_REUSEPORT, and the line waits for `companion.ready()`."""
    app = create_app(retriever, cfg, peers, slot, reranker)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)  # in-flight requests get 5 s to finish
    await runner.setup()
    site = web.TCPSite(
        runner, cfg.server.host, cfg.server.port, backlog=1024, reuse_port=True if peers is not None else None
    )
    await site.start()
    port = cfg.server.port
    if port == 0 and runner.addresses:
        port = runner.addresses[0][1]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread / not a Unix loop
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    helper: asyncio.Task | None = None
    try:
        if companion is not None:
            await companion.ready()
            helper = loop.create_task(companion.run(stop), name="retrieval-companion")
        if ready_line:
            workers = f", workers={peers.workers}" if peers is not None else ""
            print(
                f"retrieval server listening on http://{cfg.server.host}:{port} (method={cfg.retriever.method}{workers})",
                flush=True,
            )
        await stop.wait()
    finally:
        if helper is not None:
            helper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await helper
        await runner.cleanup()


def run_server(cfg: RetrievalConfig, show_progress: bool = False, **serve_kwargs: Any) -> None:
    """What one server process runs: load and warm up the retriever (and the cross-encoder of /rerank), then `serve`
    it on uvloop (when installed) until stopped. `serve_kwargs` make the process a worker of a pool
    (`retrieval.pool`)."""
    reranker = build_reranker(cfg)
    retriever = load_retriever(cfg, show_progress=show_progress, reranker=reranker)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(retriever, cfg, reranker=reranker, **serve_kwargs))
