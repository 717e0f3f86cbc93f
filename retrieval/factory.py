"""`build_retriever(config)`: the one place that turns a `RetrievalConfig` into a ready retriever.

Dispatches on `config.method`: `bm25` (load an index directory, or index the corpus in memory at start),
`dense` (encoder + faiss index file/directory, or encode a small corpus in memory), and the online engines;
wraps the result in the cross-encoder reranker when `config.reranker.enabled`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from retrieval.base import Retriever
from retrieval.corpus import DocStore
from retrieval.settings import ONLINE_METHODS, RetrievalConfig

log = logging.getLogger(__name__)


def open_store(cfg: RetrievalConfig) -> DocStore:
    if cfg.corpus_path is None:
        raise ValueError(f"retrieval.method={cfg.method!r} needs retrieval.corpus_path (the corpus JSONL)")
    index_dir = cfg.index_path if cfg.index_path is not None and Path(cfg.index_path).is_dir() else None
    return DocStore.open_cached(cfg.corpus_path, index_dir)


def build_retriever(cfg: RetrievalConfig, show_progress: bool = False) -> Retriever:
    """A loaded retriever for `cfg` (indexes read or built, models loaded)."""
    if cfg.method in ONLINE_METHODS:
        from retrieval.online import build_online_engine

        retriever: Retriever = build_online_engine(cfg.method, cfg.online)
    elif cfg.method == "bm25":
        from retrieval.bm25 import BM25Retriever

        store = open_store(cfg)
        if cfg.index_path is not None:
            retriever = BM25Retriever.load(cfg.index_path, store, threads=cfg.bm25_threads)
        else:
            log.info("no retrieval.index_path: indexing %d passages with BM25 in memory", len(store))
            retriever = BM25Retriever.build(
                store, k1=cfg.bm25_k1, b=cfg.bm25_b, threads=cfg.bm25_threads, show_progress=show_progress
            )
    elif cfg.method == "dense":
        from retrieval.dense import DenseRetriever, Encoder, build_dense_index

        store = open_store(cfg)
        encoder = Encoder(cfg.encoder)
        if cfg.index_path is not None:
            index = DenseRetriever.read_index(cfg.index_path)
        else:
            log.info(
                "no retrieval.index_path: encoding %d passages in memory (%s)", len(store), cfg.faiss_index
            )
            index, _ = build_dense_index(store, encoder, cfg.faiss_index, show_progress=show_progress)
        retriever = DenseRetriever(encoder, index, store, cfg)
    else:  # pragma: no cover - the Literal type makes this unreachable
        raise ValueError(f"unknown retrieval.method {cfg.method!r}")
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
