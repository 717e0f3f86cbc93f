"""`build_retriever(config)`: the one place that turns a `RetrievalConfig` into a ready retriever.

Dispatches on `config.method` through `BUILDERS` below, one entry per name of `retrieval.settings.METHODS`: `bm25`
(load an index directory, or index the corpus in memory at start), `dense` (encoder + faiss index file/directory, or
encode a small corpus in memory), and the online engines (`retrieval/online.py`); wraps the result in the
cross-encoder reranker when the server reranks its own searches (below). The local builders import their module
when called (bm25s, numba, torch, faiss); the online engines are imported here (aiohttp, which the server imports
anyway). Nothing that loads a config imports this module.

The cross-encoder (`build_reranker`) is loaded when `retrieval.reranker.enabled` names a `model`. It reranks the
server's own searches unless `retrieval.reranker.url` is set (then the generators rerank remotely, and the server's
cross-encoder only answers POST /rerank).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from retrieval.base import Retriever
from retrieval.corpus import open_store
from retrieval.online import BingEngine, BraveEngine, GoogleEngine, SerpApiEngine
from retrieval.settings import RetrievalConfig

if TYPE_CHECKING:
    from retrieval.reranker import CrossEncoderReranker

log = logging.getLogger(__name__)


def _bm25(cfg: RetrievalConfig, show_progress: bool) -> Retriever:
    from retrieval import bm25

    return bm25.from_config(cfg, open_store(cfg), show_progress)


def _dense(cfg: RetrievalConfig, show_progress: bool) -> Retriever:
    from retrieval import dense

    return dense.from_config(cfg, open_store(cfg), show_progress)


# `retrieval.method` -> what builds it; exactly the names of `retrieval.settings.METHODS` (tests/unit/retrieval)
BUILDERS: dict[str, Callable[[RetrievalConfig, bool], Retriever]] = {
    "bm25": _bm25,
    "dense": _dense,
    "google": GoogleEngine.from_config,
    "bing": BingEngine.from_config,
    "brave": BraveEngine.from_config,
    "serpapi": SerpApiEngine.from_config,
}


def build_reranker(cfg: RetrievalConfig) -> CrossEncoderReranker | None:
    """The server's cross-encoder (`retrieval.reranker.model`, when enabled), or None."""
    if not (cfg.reranker.enabled and cfg.reranker.model):
        return None
    from retrieval.reranker import CrossEncoderReranker

    _limit_threads(cfg)
    return CrossEncoderReranker(cfg.reranker)


def _limit_threads(cfg: RetrievalConfig) -> None:
    """`retrieval.torch_threads` intra-op threads for the encoder, the reranker and the Flat scan (0: torch's own)."""
    if cfg.torch_threads:
        import torch

        torch.set_num_threads(cfg.torch_threads)


def build_retriever(
    cfg: RetrievalConfig, show_progress: bool = False, reranker: CrossEncoderReranker | None = None
) -> Retriever:
    """A loaded retriever for `cfg` (indexes read or built, models loaded); ValueError naming the known methods for
    an unknown `cfg.method`. When the server reranks its searches (`cfg.reranks_searches`), the first stage goes
    behind `reranker` (default: `build_reranker(cfg)`)."""
    build = BUILDERS.get(cfg.method)
    if build is None:
        raise ValueError(f"unknown retrieval.method {cfg.method!r}; known methods: {', '.join(BUILDERS)}")
    retriever = build(cfg, show_progress)
    if cfg.reranks_searches:
        from retrieval.reranker import RerankingRetriever

        reranker = reranker if reranker is not None else build_reranker(cfg)
        retriever = RerankingRetriever(retriever, reranker, cfg.reranker.candidates)
    return retriever


def load_retriever(
    cfg: RetrievalConfig, show_progress: bool = False, reranker: CrossEncoderReranker | None = None
) -> Retriever:
    """`build_retriever`, then warmed up (numba JIT, first forward pass) so the first request is not slow; what a
    server process (or each worker of one) runs before it listens."""
    if cfg.method == "dense" or cfg.reranks_searches:
        _limit_threads(cfg)
    t0 = time.perf_counter()
    retriever = build_retriever(cfg, show_progress=show_progress, reranker=reranker)
    warm = getattr(retriever, "warmup", None)
    if warm is not None:
        warm()
    log.info("retriever %s ready in %.1fs", cfg.method, time.perf_counter() - t0)
    return retriever
