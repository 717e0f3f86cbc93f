"""Fixtures for the retrieval unit tests: a small generated corpus and a BM25 retriever over it."""

from __future__ import annotations

import pytest

from fakes.corpus import synthetic_records
from retrieval.corpus import DocStore, write_corpus_jsonl

FACTS = [
    {"id": "paris", "title": "Paris", "text": "Paris is the capital and largest city of France."},
    {"id": "tokyo", "title": "Tokyo", "text": "Tokyo is the capital of Japan and its most populous city."},
    {
        "id": "nile",
        "title": "Nile",
        "text": "The Nile is a major north-flowing river in northeastern Africa.",
    },
]


@pytest.fixture(scope="session")
def corpus_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    write_corpus_jsonl(path, FACTS + list(synthetic_records(500)))
    return path


@pytest.fixture(scope="session")
def bm25(corpus_path):
    from retrieval.bm25 import BM25Retriever

    retriever = BM25Retriever.build(DocStore(corpus_path))
    retriever.warmup()
    return retriever
