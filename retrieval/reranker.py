"""Cross-encoder reranking of each query's *own* candidate list.

Search-R1's rerank server scores every query against the documents of every query in the batch (a B x B*k
product, then keeps the diagonal); here each query is paired only with its candidates, so the work is the
sum of the candidate list lengths. `RerankingRetriever` puts the reranker behind any first-stage retriever.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import Executor

import numpy as np

from retrieval.base import Hits, Retriever
from retrieval.settings import RerankerConfig


class CrossEncoderReranker:
    """A Hugging Face sequence-classification model scoring (query, passage) pairs."""

    def __init__(self, cfg: RerankerConfig):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from retrieval.encoder import pick_device

        self.cfg = cfg
        self.device = pick_device(cfg.device)
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model)
        dtype = torch.float16 if self.device.startswith("cuda") else torch.float32
        self.model = (
            AutoModelForSequenceClassification.from_pretrained(cfg.model, dtype=dtype).to(self.device).eval()
        )

    def score_pairs(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """Relevance of each (query, passage) pair: the logit (one-label models) or the last label's logit."""
        import torch

        out = []
        for i in range(0, len(pairs), self.cfg.batch_size):
            chunk = pairs[i : i + self.cfg.batch_size]
            batch = self.tokenizer(
                [q for q, _ in chunk],
                [p for _, p in chunk],
                padding=True,
                truncation=True,
                max_length=self.cfg.max_length,
                return_tensors="pt",
            ).to(self.device)
            with torch.inference_mode():
                logits = self.model(**batch).logits.float()
            out.append(logits[:, -1].cpu().numpy())
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)

    def rerank(self, queries: list[str], candidates: list[Hits], topk: int) -> list[Hits]:
        """Re-order each query's candidates by cross-encoder score and keep `topk`."""
        pairs = [(q, d["contents"]) for q, hits in zip(queries, candidates, strict=True) for d in hits.docs]
        scores = self.score_pairs(pairs)
        out, start = [], 0
        for hits in candidates:
            s = scores[start : start + len(hits.docs)]
            start += len(hits.docs)
            order = np.argsort(-s, kind="stable")[:topk]
            out.append(Hits([hits.docs[i] for i in order], [float(s[i]) for i in order]))
        return out


class RerankingRetriever:
    """First stage `base` retrieves `candidates` per query; the reranker keeps the best `topk` of them."""

    def __init__(self, base: Retriever, reranker: CrossEncoderReranker, candidates: int):
        self.base = base
        self.reranker = reranker
        self.candidates = candidates
        self.name = f"{base.name}+rerank"
        self.store = getattr(base, "store", None)

    def search(self, queries: list[str], topk: int) -> list[Hits]:
        first = self.base.search(queries, max(topk, self.candidates))
        return self.reranker.rerank(queries, first, topk)

    async def asearch(self, queries: list[str], topk: int, executor: Executor | None = None) -> list[Hits]:
        first = await self.base.asearch(queries, max(topk, self.candidates), executor)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, self.reranker.rerank, queries, first, topk)

    def warmup(self) -> None:
        warm = getattr(self.base, "warmup", None)
        if warm is not None:
            warm()

    def close(self) -> None:
        self.base.close()
