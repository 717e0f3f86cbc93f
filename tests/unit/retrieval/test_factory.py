"""`build_retriever` and `build_index` build whatever member of the retriever union the config holds, and
`build_index` refuses a member without an index by naming those that have one."""

from __future__ import annotations

import numpy as np
import pytest

from retrieval import dense
from retrieval.bm25 import BM25Retriever, BM25Settings
from retrieval.build_index import build_index
from retrieval.factory import build_retriever
from retrieval.online import OnlineEngine
from retrieval.settings import RetrievalConfig
from retrieval.union import RETRIEVERS


def test_bm25_builds_a_bm25_retriever(corpus_path):
    retriever = build_retriever(RetrievalConfig(retriever={"method": "bm25", "corpus_path": corpus_path}))
    assert type(retriever) is BM25Retriever
    assert [doc["id"] for doc in retriever.search(["capital of France"], 1)[0].docs] == ["paris"]


class _WordHashEncoder:
    """Stands in for the text encoder (no model to load): a normalised bag of hashed words."""

    dim = 64

    def __init__(self, cfg):
        self.cfg = cfg

    def _embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                out[row, sum(map(ord, word.strip('".,?'))) % self.dim] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        return self._embed(queries)

    def encode_passages(self, passages: list[str], batch_size: int | None = None) -> np.ndarray:
        return self._embed(passages)


def test_dense_builds_in_memory_writes_its_index_and_loads_it(corpus_path, tmp_path, monkeypatch):
    monkeypatch.setattr(dense, "Encoder", _WordHashEncoder)
    in_memory = {"method": "dense", "corpus_path": corpus_path, "faiss_gpu": False}
    retriever = build_retriever(RetrievalConfig(retriever=in_memory))
    assert type(retriever) is dense.DenseRetriever
    query = "Paris is the capital and largest city of France."
    assert retriever.search([query], 1)[0].docs[0]["id"] == "paris"

    assert build_index(dense.DenseSettings(corpus_path=corpus_path), tmp_path, show_progress=False) == 503
    assert (tmp_path / dense.FAISS_FILE).is_file() and (tmp_path / "doc_offsets.npy").is_file()
    loaded = build_retriever(RetrievalConfig(retriever=in_memory | {"index_path": tmp_path}))
    assert loaded.index.ntotal == 503 and loaded.search([query], 1)[0].docs[0]["id"] == "paris"


@pytest.mark.parametrize("method", [name for name, member in RETRIEVERS.items() if not member.local])
def test_each_online_method_builds_its_engine(method, monkeypatch):
    monkeypatch.setenv("SR1_TEST_KEY", "k")
    retriever = {"method": method, "api_key_env": "SR1_TEST_KEY"}
    if method == "google":  # google also needs its search engine id
        monkeypatch.setenv("SR1_TEST_CX", "cx")
        retriever["cx_env"] = "SR1_TEST_CX"
    engine = build_retriever(RetrievalConfig(retriever=retriever))
    assert isinstance(engine, OnlineEngine) and engine.name == method


def test_build_index_names_the_methods_with_an_index(tmp_path, corpus_path):
    brave = RetrievalConfig(retriever="brave").retriever
    with pytest.raises(ValueError, match="build-index supports --method bm25 or dense, not 'brave'"):
        build_index(brave, tmp_path)
    with pytest.raises(ValueError, match="build-index needs a corpus"):
        build_index(BM25Settings(), tmp_path)
    with pytest.raises(ValueError, match="'bm25' needs retrieval.retriever.corpus_path"):
        build_retriever(RetrievalConfig())
