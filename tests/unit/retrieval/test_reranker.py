"""The reranker scores each query only against its own candidates, and re-orders them by score."""

from __future__ import annotations

import numpy as np
import pytest

from retrieval.base import Hits, LocalRetriever
from retrieval.reranker import CrossEncoderReranker, RerankingRetriever
from retrieval.settings import RerankerConfig
from tests.fakes.cross_encoder import build_tiny_cross_encoder


class LengthScorer(CrossEncoderReranker):
    """Scores a pair by -len(passage) (shorter is better); records every pair it was asked about."""

    def __init__(self):
        self.pairs: list[tuple[str, str]] = []

    def score_pairs(self, pairs):
        self.pairs.extend(pairs)
        return np.array([-len(p) for _, p in pairs], dtype=np.float32)


class ListRetriever(LocalRetriever):
    name = "list"

    def search(self, queries, topk):
        return [
            Hits([{"id": f"{q}{i}", "contents": "x" * (10 - i) + q} for i in range(topk)], [1.0] * topk)
            for q in queries
        ]


def test_each_query_is_scored_against_its_own_candidates_only():
    scorer = LengthScorer()
    retriever = RerankingRetriever(ListRetriever(), scorer, candidates=5)
    hits = retriever.search(["a", "bb"], 2)
    assert len(scorer.pairs) == 10  # 2 queries x 5 candidates, not 2 x 10
    assert all(p.endswith(q) for q, p in scorer.pairs)
    # the shortest passages (last of the first stage) come first after reranking
    assert [d["id"] for d in hits[0].docs] == ["a4", "a3"] and [d["id"] for d in hits[1].docs] == [
        "bb4",
        "bb3",
    ]
    assert hits[0].scores == sorted(hits[0].scores, reverse=True)


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory):
    """A random-init one-layer BERT classifier with the MiniLM tokenizer, saved in HF format."""
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("xenc"))


def test_hf_cross_encoder_scores_pairs_and_keeps_topk(tiny_cross_encoder):
    reranker = CrossEncoderReranker(
        RerankerConfig(enabled=True, model=str(tiny_cross_encoder), batch_size=3, device="cpu")
    )
    candidates = ListRetriever().search(["q1", "q2"], 5)
    out = reranker.rerank(["q1", "q2"], candidates, 3)
    assert [len(h.docs) for h in out] == [3, 3]
    for before, after in zip(candidates, out, strict=True):
        assert {d["id"] for d in after.docs} <= {d["id"] for d in before.docs}
        assert after.scores == sorted(after.scores, reverse=True)
    # scoring is deterministic and independent of batching
    direct = reranker.score_pairs([("q1", candidates[0].docs[0]["contents"])])
    batched = reranker.score_pairs([("q2", "zzz"), ("q1", candidates[0].docs[0]["contents"])])
    assert direct[0] == pytest.approx(batched[1], abs=1e-5)
