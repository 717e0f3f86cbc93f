"""The pruned BM25 scorer (own posting-list kernel) against bm25s's corpus-sized scan it replaces."""

from __future__ import annotations

import numpy as np
import pytest

import retrieval.bm25 as bm25_mod
from fakes.corpus import synthetic_queries, synthetic_records
from retrieval.bm25 import BM25Retriever
from retrieval.corpus import DocStore, write_corpus_jsonl

pytest.importorskip("numba")


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    path = tmp_path_factory.mktemp("bm25_sparse") / "corpus.jsonl"
    write_corpus_jsonl(path, synthetic_records(3000, seed=7))
    r = BM25Retriever.build(DocStore(path))
    r.warmup()
    return r


@pytest.fixture(scope="module")
def queries():
    records = list(synthetic_records(3000, seed=7))
    extra = [
        "river river river Norvale",  # repeated tokens count once per occurrence, as in bm25s
        "known for known",
        "ancient temple of Estria and the silver bridge",
        "maps drawn before recorded year",  # common words only: pruning rarely decides early
    ]
    return synthetic_queries(records, 60, seed=3) + extra


def _reference(r: BM25Retriever, queries: list[str], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rows, scores = r._score([r.query_term_ids(q) for q in queries], k)
    return [(rw[s > 0], s[s > 0]) for rw, s in zip(rows, scores, strict=True)]


def _check_same(r: BM25Retriever, queries: list[str], k: int) -> None:
    got = r._score_pruned([r.query_term_ids(q) for q in queries], k)
    want = _reference(r, queries, k)
    for q, (docs, scores), (ref_docs, ref_scores) in zip(queries, got, want, strict=True):
        assert len(docs) == len(ref_docs), q
        assert np.all(np.diff(scores) <= 0), q  # best first
        np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, err_msg=q)
        # every returned document carries its true bm25s score, so ids differ only among equal scores
        full = r.model.get_scores_from_ids(r.query_term_ids(q))
        np.testing.assert_allclose(full[docs], scores, rtol=1e-5, err_msg=q)
        strict = ref_scores > ref_scores[-1] * (1 + 1e-5) if len(ref_scores) else ref_scores > 0
        assert set(ref_docs[strict].tolist()) <= set(docs.tolist()), q


@pytest.mark.parametrize("k", [1, 3, 10, 200])
def test_pruned_scorer_matches_bm25s(retriever, queries, k):
    _check_same(retriever, queries, k)


def test_pruning_and_fallback_both_stay_exact(retriever, queries, monkeypatch):
    # A tiny essential budget makes common terms non-essential, so both the early stop and the fallback run.
    monkeypatch.setattr(bm25_mod, "PRUNED_MIN_ESSENTIAL", 1)
    monkeypatch.setattr(bm25_mod, "PRUNED_ESSENTIAL_FRACTION", 0.0)
    retriever.fallbacks = 0
    _check_same(retriever, queries, 3)
    _check_same(retriever, queries, 50)
    assert retriever.fallbacks > 0


def test_search_uses_pruned_scorer_and_matches_bm25s_path(retriever, queries):
    assert retriever.scorer == "pruned"
    pruned = retriever.search(queries, 5)
    retriever.scorer = "bm25s"
    try:
        old = retriever.search(queries, 5)
    finally:
        retriever.scorer = "pruned"
    for q, a, b in zip(queries, pruned, old, strict=True):
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5, err_msg=q)


def test_batches_split_across_threads_match_one_by_one(retriever, queries):
    ids = [retriever.query_term_ids(q) for q in queries]
    retriever.threads = 2
    try:
        batched = retriever._score_pruned(ids, 5)
    finally:
        retriever.threads = 1
    for q, (docs, scores) in zip(ids, batched, strict=True):
        d1, s1 = retriever._score_pruned([q], 5)[0]
        assert docs.tolist() == d1.tolist() and scores.tolist() == s1.tolist()


def test_unsorted_posting_lists_fall_back_to_bm25s(retriever, monkeypatch):
    monkeypatch.setattr(bm25_mod, "_postings_sorted", lambda indices, indptr: False)
    r = BM25Retriever(retriever.model, retriever.store, threads=1)
    assert r.scorer == "pruned"
    hits = r.search(["ancient temple of Estria"], 3)
    assert r.scorer == "bm25s" and hits[0].docs
