import pytest
from pydantic import ValidationError

from retrieval.settings import RetrievalConfig


def test_defaults_are_the_embedded_cpu_run():
    cfg = RetrievalConfig()
    assert (cfg.method, cfg.topk, cfg.host) == ("bm25", 3, "127.0.0.1")
    assert cfg.url.endswith("/retrieve") and cfg.batching and cfg.token is None


def test_every_field_is_documented():
    fields = RetrievalConfig.model_fields
    for model in (RetrievalConfig, fields["encoder"].annotation, fields["reranker"].annotation):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"


def test_validation_names_the_numbers():
    with pytest.raises(ValidationError, match=r"topk \(7\) must be <= retrieval.max_topk \(5\)"):
        RetrievalConfig(topk=7, max_topk=5)
    with pytest.raises(
        ValidationError, match="neither retrieval.reranker.model .* nor retrieval.reranker.url"
    ):
        RetrievalConfig(reranker={"enabled": True})
    remote = {"enabled": True, "url": "http://h:6980/rerank"}
    with pytest.raises(ValidationError, match=r"candidates \(200\) must be <= retrieval.max_topk \(100\)"):
        RetrievalConfig(reranker=remote | {"candidates": 200})
    with pytest.raises(ValidationError, match=r"candidates \(2\) must be >= retrieval.topk \(3\)"):
        RetrievalConfig(reranker=remote | {"candidates": 2})
    with pytest.raises(ValidationError, match="reranker.url must be an http"):
        RetrievalConfig(reranker=remote | {"url": "h:6980/rerank"})
    with pytest.raises(ValidationError, match="extra"):
        RetrievalConfig(topK=3)


def test_unknown_method_is_refused_naming_the_known_ones():
    message = r"unknown retrieval.method 'bm26'; known methods: bm25, dense, google, bing, brave, serpapi"
    with pytest.raises(ValidationError, match=message):
        RetrievalConfig(method="bm26")


def test_registry_says_which_methods_serve_a_local_index():
    from retrieval.settings import METHODS, is_local_method

    assert [name for name in METHODS if is_local_method(name)] == ["bm25", "dense"]
    assert set(METHODS) == {"bm25", "dense", "google", "bing", "brave", "serpapi"}
    assert RetrievalConfig(method="dense").serves_locally
    assert not RetrievalConfig(method="brave").serves_locally
    with pytest.raises(ValueError, match="known methods: bm25, dense"):
        is_local_method("pyserini")


def test_who_reranks():
    local = RetrievalConfig(reranker={"enabled": True, "model": "/models/xenc"})
    remote = RetrievalConfig(reranker={"enabled": True, "url": "http://h:6980/rerank"})
    both = RetrievalConfig(reranker={"enabled": True, "model": "/models/xenc", "url": "http://h:8000/rerank"})
    assert local.reranks_searches and not remote.reranks_searches and not both.reranks_searches
    assert not RetrievalConfig(reranker={"model": "/models/xenc"}).reranks_searches  # not enabled
