"""`build_retriever(config)`: the one place that turns a `RetrievalConfig` into a ready retriever.

Dispatches on `config.method` through the registry `retrieval.settings.METHODS`: `bm25` (load an index
directory, or index the corpus in memory at start), `dense` (encoder + faiss index file/directory, or encode a
small corpus in memory), and the online engines; wraps the result in the cross-encoder reranker when
`config.reranker.enabled`.
"""

from __future__ import annotations

import logging
import time

from common.imports import import_object
from retrieval.base import Retriever
from retrieval.settings import RetrievalConfig, retrieval_method

log = logging.getLogger(__name__)


def build_retriever(cfg: RetrievalConfig, show_progress: bool = False) -> Retriever:
    """A loaded retriever for `cfg` (indexes read or built, models loaded)."""
    retriever: Retriever = import_object(retrieval_method(cfg.method).build)(cfg, show_progress)
    if cfg.reranker.enabled:
        from retrieval.reranker import CrossEncoderReranker, RerankingRetriever

        retriever = RerankingRetriever(retriever, CrossEncoderReranker(cfg.reranker), cfg.reranker.candidates)
    return retriever


def load_retriever(cfg: RetrievalConfig, show_progress: bool = False) -> Retriever:
    """`build_retriever`, then warmed up (numba JIT, first forward pass) so the first request is not slow; what a
    server process (or each worker of one) runs before it listens."""
    if cfg.torch_threads and (cfg.method == "dense" or cfg.reranker.enabled):
        import torch

        torch.set_num_threads(cfg.torch_threads)
    t0 = time.perf_counter()
    retriever = build_retriever(cfg, show_progress=show_progress)
    warm = getattr(retriever, "warmup", None)
    if warm is not None:
        warm()
    log.info("retriever %s ready in %.1fs", cfg.method, time.perf_counter() - t0)
    return retriever
