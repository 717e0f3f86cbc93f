"""`build_retriever(config)`: the one place that turns a `RetrievalConfig` into a ready retriever.

The retriever is what `retrieval.retriever` (a member of the retriever union, `retrieval/union.py`) builds; the
factory puts it behind the cross-encoder reranker when the server reranks its own searches, and warms it up.

The cross-encoder (`build_reranker`) is loaded when `retrieval.reranker.enabled` names a `model`. It reranks the
server's own searches unless `retrieval.reranker.url` is set (then the generators rerank remotely, and the server's
cross-encoder only answers POST /rerank).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from retrieval.base import Retriever
from retrieval.settings import RetrievalConfig

if TYPE_CHECKING:
    from retrieval.reranker import CrossEncoderReranker

log = logging.getLogger(__name__)


def build_reranker(cfg: RetrievalConfig) -> CrossEncoderReranker | None:
    """The server's cross-encoder (`retrieval.reranker.model`, when enabled), or None."""
    if not (cfg.reranker.enabled and cfg.reranker.model):
        return None
    from retrieval.reranker import CrossEncoderReranker

    _limit_threads(cfg)
    return CrossEncoderReranker(cfg.reranker)


def _limit_threads(cfg: RetrievalConfig) -> None:
    """`retrieval.server.torch_threads` intra-op threads for the encoder, the reranker and the Flat scan (0: torch's
    own)."""
    if cfg.server.torch_threads:
        import torch

        torch.set_num_threads(cfg.server.torch_threads)


def build_retriever(
    cfg: RetrievalConfig, show_progress: bool = False, reranker: CrossEncoderReranker | None = None
) -> Retriever:
    """A loaded retriever for `cfg` (indexes read or built, models loaded). When the server reranks its searches
    (`cfg.reranks_searches`), the first stage goes behind `reranker` (default: `build_reranker(cfg)`)."""
    retriever = cfg.retriever.build(show_progress)
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
    if cfg.retriever.uses_torch or cfg.reranks_searches:
        _limit_threads(cfg)
    t0 = time.perf_counter()
    retriever = build_retriever(cfg, show_progress=show_progress, reranker=reranker)
    warm = getattr(retriever, "warmup", None)
    if warm is not None:
        warm()
    log.info("retriever %s ready in %.1fs", cfg.retriever.method, time.perf_counter() - t0)
    return retriever
