"""`build_retriever` and `build_index` dispatch every name of `retrieval.settings.METHODS` to its module, and refuse
any other name by listing the known ones."""

from __future__ import annotations

import pytest

from retrieval.build_index import INDEX_BUILDERS, build_index
from retrieval.factory import BUILDERS, build_retriever
from retrieval.settings import METHODS, RetrievalConfig


def test_the_dispatch_tables_cover_the_methods_exactly():
    assert list(BUILDERS) == list(METHODS)
    assert all(callable(build) for build in BUILDERS.values())
    assert list(INDEX_BUILDERS) == [name for name, m in METHODS.items() if m.local]


def test_bm25_builds_a_bm25_retriever(corpus_path):
    from retrieval.bm25 import BM25Retriever

    retriever = build_retriever(RetrievalConfig(method="bm25", corpus_path=corpus_path))
    assert type(retriever) is BM25Retriever
    assert [doc["id"] for doc in retriever.search(["capital of France"], 1)[0].docs] == ["paris"]


def test_dense_is_built_by_the_dense_module(corpus_path, tmp_path, monkeypatch):
    # without loading an encoder: the factories hand the config and the opened corpus to retrieval.dense
    from retrieval import dense

    calls = []
    monkeypatch.setattr(dense, "from_config", lambda cfg, store, show: calls.append(len(store)) or "d")
    monkeypatch.setattr(dense, "build_index_files", lambda cfg, store, out, show: calls.append(out))
    cfg = RetrievalConfig(method="dense", corpus_path=corpus_path)
    assert build_retriever(cfg) == "d"
    assert build_index(cfg, tmp_path, show_progress=False) == 503
    assert calls == [503, tmp_path]


@pytest.mark.parametrize("method", [name for name, m in METHODS.items() if not m.local])
def test_each_online_method_builds_its_engine(method, monkeypatch):
    from retrieval.online import OnlineEngine

    monkeypatch.setenv("SR1_TEST_KEY", "k")
    monkeypatch.setenv("SR1_TEST_CX", "cx")  # google also needs its search engine id
    cfg = RetrievalConfig(
        method=method, online={"api_key_env": "SR1_TEST_KEY", "google_cx_env": "SR1_TEST_CX"}
    )
    engine = build_retriever(cfg)
    assert isinstance(engine, OnlineEngine) and engine.name == method


def test_unknown_names_fail_naming_the_known_ones(tmp_path):
    unvalidated = RetrievalConfig.model_construct(method="bm26")
    with pytest.raises(
        ValueError, match="unknown retrieval.method 'bm26'; known methods: bm25, dense, google"
    ):
        build_retriever(unvalidated)
    with pytest.raises(ValueError, match="build_index supports bm25, dense, not 'brave'"):
        build_index(RetrievalConfig(method="brave"), tmp_path)
