"""Adding a retriever is one module and one member of the union: `tests/fakes/toy_retriever.py`, registered, is
loaded by the config, offered by the CLI, built by the factory and served by the server, with nothing else changed."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer

from config import ConfigError, load_config
from config.cli import reference_rows
from retrieval.factory import load_retriever
from retrieval.server import create_app
from retrieval.union import RETRIEVERS, register_retriever
from sr1.entrypoints.retrieval import load_retrieval_config, parse_args
from tests.fakes.toy_retriever import ToyRetriever, ToySettings


@pytest.fixture
def toy():
    register_retriever(ToySettings)
    yield
    del RETRIEVERS["toy"]


def test_the_config_loads_the_toy_with_its_own_knobs(toy, corpus_path):
    cfg = load_config("tiny", ["retrieval.retriever=toy", f"retrieval.retriever.corpus_path={corpus_path}"])
    assert cfg.retrieval.retriever == ToySettings(corpus_path=corpus_path)
    assert (
        load_config(
            "tiny", ["retrieval.retriever.method=toy", "retrieval.retriever.min_overlap=2"]
        ).retrieval.retriever.min_overlap
        == 2
    )
    with pytest.raises(ConfigError, match="min_overlap is a setting of toy, not of 'bm25'"):
        load_config("tiny", ["retrieval.retriever.min_overlap=2"])
    with pytest.raises(
        ConfigError, match="retrieval.retriever.min_overlap: expected a number, got the boolean"
    ):
        load_config("tiny", ["retrieval.retriever=toy", "retrieval.retriever.min_overlap=true"])
    rows = {key: description for key, _, _, description in reference_rows()}
    assert rows["retrieval.retriever.min_overlap"].startswith("(toy) Words a passage shares")


def test_unregistered_the_toy_is_unknown_naming_the_known_methods():
    with pytest.raises(
        ConfigError, match="unknown retrieval.retriever.method 'toy'; known methods: bm25, dense"
    ):
        load_config("tiny", ["retrieval.retriever=toy"])


async def test_the_cli_offers_it_and_the_server_serves_it(toy, corpus_path):
    args = parse_args(
        ["serve", "--method", "toy", "--corpus", str(corpus_path), "retrieval.retriever.min_overlap=2"]
    )
    cfg = load_retrieval_config(args)
    retriever = load_retriever(cfg)
    assert type(retriever) is ToyRetriever and retriever.min_overlap == 2
    client = TestClient(TestServer(create_app(retriever, cfg)))
    await client.start_server()
    try:
        health = await (await client.get("/health")).json()
        assert health["method"] == "toy" and health["num_docs"] == 503
        answer = await (
            await client.post("/retrieve", json={"queries": ["capital of Japan"], "topk": 1})
        ).json()
    finally:
        await client.close()
    assert [doc["id"] for doc in answer["result"][0]] == ["tokyo"]
