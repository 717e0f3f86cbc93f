"""The retrieval server as a real process: Search-R1's client code against it, limits over a socket, index files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from fakes import retrieval_server as retrieval_testing
from fakes.corpus import synthetic_records
from fakes.retrieval_server import stop_server
from retrieval.corpus import write_corpus_jsonl
from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[2]
FACTS = [
    {"id": "paris", "title": "Paris", "text": "Paris is the capital and largest city of France."},
    {
        "id": "everest",
        "title": "Mount Everest",
        "text": "Mount Everest is Earth's highest mountain above sea level.",
    },
    {
        "id": "nile",
        "title": "Nile",
        "text": "The Nile is a major north-flowing river in northeastern Africa.",
    },
]


def start_server(args: list[str], port: int, timeout_s: float = 60.0) -> subprocess.Popen:
    """Start `python -m sr1.entrypoints.retrieval serve ...`, wait for its listening line and /health, return the process."""
    proc, _ = retrieval_testing.start_server(args, port, scaled(timeout_s))
    health = requests.get(f"http://127.0.0.1:{port}/health", timeout=scaled(5))
    assert health.status_code == 200 and health.json()["status"] == "ok"
    return proc


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("retrieval") / "wiki.jsonl"
    write_corpus_jsonl(path, FACTS + list(synthetic_records(2000)))
    return path


@pytest.fixture(scope="module")
def bm25_server(corpus, tmp_path_factory):
    from sr1.launch.supervisor import free_port

    port = free_port()
    proc = start_server(["--method", "bm25", "--corpus", str(corpus)], port)
    yield f"http://127.0.0.1:{port}"
    stop_server(proc)


# --- Search-R1's client, as its generation.py does it ---------------------------------------------------------
def _search_r1_batch_search(url: str, queries: list[str], topk: int) -> list[str]:
    payload = {"queries": queries, "topk": topk, "return_scores": True}
    answer = requests.post(url, json=payload).json()
    out = []
    for retrieval_result in answer["result"]:
        format_reference = ""
        for idx, doc_item in enumerate(retrieval_result):
            content = doc_item["document"]["contents"]
            title = content.split("\n")[0]
            text = "\n".join(content.split("\n")[1:])
            format_reference += f"Doc {idx + 1}(Title: {title}) {text}\n"
        out.append(format_reference)
    return out


def test_search_r1_client_gets_what_it_expects(bm25_server):
    texts = _search_r1_batch_search(
        f"{bm25_server}/retrieve", ["largest city of France", "highest mountain"], 3
    )
    assert texts[0].startswith('Doc 1(Title: "Paris") Paris is the capital and largest city of France.\n')
    assert texts[1].startswith('Doc 1(Title: "Mount Everest") Mount Everest')
    assert texts[0].count("\n") == 3


def test_our_client_formats_like_search_r1(bm25_server):
    import asyncio

    from retrieval.client import RetrievalClient
    from tasks.search_r1.protocol import format_documents

    async def go():
        async with RetrievalClient(f"{bm25_server}/retrieve", topk=3) as client:
            return await client.search("largest city of France")

    ours = format_documents(asyncio.run(go()).documents)
    theirs = _search_r1_batch_search(f"{bm25_server}/retrieve", ["largest city of France"], 3)[0]
    assert theirs.count("Doc ") == 3
    assert ours == theirs.strip()


def test_return_scores_false_gives_bare_documents(bm25_server):
    r = requests.post(
        f"{bm25_server}/retrieve",
        json={"queries": ["river in Africa"], "topk": 2, "return_scores": False},
    )
    first = r.json()["result"][0][0]
    assert first == {
        "id": "nile",
        "contents": '"Nile"\nThe Nile is a major north-flowing river in northeastern Africa.',
    }


def test_bad_input_gets_json_4xx_and_the_server_survives(bm25_server):
    url = f"{bm25_server}/retrieve"
    cases = [
        (b"{", 400),
        (json.dumps({"queries": [1]}).encode(), 400),
        (json.dumps({"queries": ["a"], "topk": 10_000}).encode(), 400),
        (json.dumps({"queries": ["a"] * 5000}).encode(), 413),
        (b'{"queries": ["' + b"a" * (5 * 1024 * 1024) + b'"]}', 413),
    ]
    for body, status in cases:
        r = requests.post(url, data=body, headers={"Content-Type": "application/json"})
        assert r.status_code == status, r.text
        assert "error" in r.json()
    assert requests.post(url, json={"queries": ["Nile river"]}).status_code == 200
    metrics = requests.get(f"{bm25_server}/metrics").json()
    assert metrics["retrieval/errors"]["400"] >= 3


def test_fuzzer_cases_over_a_socket(bm25_server):
    url = f"{bm25_server}/retrieve"
    before = requests.get(f"{bm25_server}/metrics").json()
    nested = b"[" * 100_000 + b"]" * 100_000  # json.loads raises RecursionError on it
    r = requests.post(url, data=nested, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]
    # Search-R1 clients that send extra fields are served, as by Search-R1's server; the fields are counted
    r = requests.post(
        url, json={"queries": ["Nile river"], "topk": 2, "return_scores": True, "top_k": 5, "x": 1}
    )
    assert r.status_code == 200 and len(r.json()["result"][0]) == 2
    r = requests.post(url, json={"queries": ["", " "], "topk": 3})
    assert r.status_code == 200 and [len(docs) for docs in r.json()["result"]] == [3, 3]
    assert [d["id"] for d in r.json()["result"][0]] == ["paris", "everest", "nile"]
    after = requests.get(f"{bm25_server}/metrics").json()
    assert after["retrieval/unknown_fields"] - before["retrieval/unknown_fields"] == 2
    assert after["retrieval/errors"].get("500", 0) == before["retrieval/errors"].get("500", 0)


def _build_bm25_index(corpus: Path, out: Path, timeout_s: float) -> subprocess.CompletedProcess:
    """`python -m sr1.entrypoints.retrieval build-index --method bm25` as a separate process."""
    cmd = [
        sys.executable,
        "-m",
        "sr1.entrypoints.retrieval",
        "build-index",
        "--method",
        "bm25",
        "--corpus",
        str(corpus),
        "--out",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)


def test_build_index_then_serve_from_it(corpus, tmp_path):
    from sr1.launch.supervisor import free_port

    out = tmp_path / "bm25_index"
    t0 = time.monotonic()
    done = _build_bm25_index(corpus, out, timeout_s=scaled(120))
    assert done.returncode == 0, done.stderr
    assert "built bm25 index over 2003 passages" in done.stdout
    assert time.monotonic() - t0 < scaled(60)  # 60 s on the idle reference machine
    port = free_port()
    proc = start_server(["--method", "bm25", "--corpus", str(corpus), "--index", str(out)], port)
    try:
        r = requests.post(
            f"http://127.0.0.1:{port}/retrieve", json={"queries": ["capital of France"], "topk": 1}
        )
        assert r.json()["result"][0][0]["id"] == "paris"
    finally:
        stop_server(proc)


def test_bad_corpus_line_fails_with_the_line_number(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "0", "contents": "\\"A\\"\\nfine"}\n{"id": "1", "contents": \n')
    done = _build_bm25_index(bad, tmp_path / "x", timeout_s=scaled(60))
    assert done.returncode != 0
    assert "bad.jsonl:2: not valid JSON" in done.stderr


def test_bearer_token_is_required_when_set(corpus):
    from sr1.launch.supervisor import free_port

    port = free_port()
    proc = start_server(["--method", "bm25", "--corpus", str(corpus), "--token", "s3cret"], port)
    try:
        url = f"http://127.0.0.1:{port}/retrieve"
        r = requests.post(url, json={"queries": ["Nile"]})
        assert r.status_code == 401 and "bearer token" in r.json()["error"]
        r = requests.post(url, json={"queries": ["Nile"]}, headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200 and r.json()["result"][0][0]["id"] == "nile"
    finally:
        stop_server(proc)


# --- Search-R1's /rerank, served with a cross-encoder ------------------------------------------------------------
def test_a_server_with_a_cross_encoder_answers_search_r1s_rerank_and_sr1s_client(corpus, tmp_path):
    """One server is Search-R1's two: /retrieve (not reranked, since the reranker is remote) and /rerank with its
    cross-encoder; Search-R1's generation and sr1's client both rerank through it."""
    import asyncio

    from retrieval.client import RetrievalClient
    from retrieval.settings import RetrievalConfig
    from sr1.launch.supervisor import free_port
    from tests.fakes.cross_encoder import build_tiny_cross_encoder

    model = build_tiny_cross_encoder(tmp_path / "xenc")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    reranker = {
        "enabled": True,
        "model": str(model),
        "url": f"{base}/rerank",
        "candidates": 5,
        "device": "cpu",
    }
    overrides = [f"retrieval.reranker.{k}={v}" for k, v in reranker.items()]
    proc = start_server(["--method", "bm25", "--corpus", str(corpus), *overrides], port)
    try:
        assert requests.get(f"{base}/health", timeout=scaled(5)).json()["rerank"] is True
        # Search-R1's generation: /retrieve with scores, then /rerank with those entries as they came
        queries = ["largest city of France", "river in Africa"]
        retrieved = requests.post(
            f"{base}/retrieve", json={"queries": queries, "topk": 5, "return_scores": True}
        ).json()["result"]
        assert [len(r) for r in retrieved] == [5, 5] and retrieved[0][0]["document"]["id"] == "paris"
        request = {"queries": queries, "documents": retrieved, "rerank_topk": 3, "return_scores": True}
        reranked = requests.post(f"{base}/rerank", json=request).json()["result"]
        for docs, answer in zip(retrieved, reranked, strict=True):
            shown = {e["document"] for e in answer}
            sent = {search_r1_passage(e["document"]["contents"]) for e in docs}
            assert len(answer) == 3 and shown <= sent  # its own documents only, in Search-R1's form
            assert [e["score"] for e in answer] == sorted((e["score"] for e in answer), reverse=True)
        # sr1's client with the same config: 5 candidates from /retrieve, the best 3 by /rerank
        cfg = RetrievalConfig(client={"url": f"{base}/retrieve"}, topk=3, reranker=reranker)

        async def search():
            async with RetrievalClient.from_config(cfg) as client:
                return await client.search("largest city of France")

        result = asyncio.run(search())
        assert result.ok and len(result.documents) == 3
        assert {d["id"] for d in result.documents} <= {e["document"]["id"] for e in retrieved[0]}
        assert [search_r1_passage(d["contents"]) for d in result.documents] == [
            e["document"] for e in reranked[0]
        ]
        metrics = requests.get(f"{base}/metrics").json()
        assert metrics["retrieval/rerank_requests"] == 2 and metrics["retrieval/reranked_queries"] == 3
    finally:
        stop_server(proc)


def search_r1_passage(contents: str) -> str:
    """The passage as Search-R1's reranker names it."""
    title = contents.split("\n")[0]
    return f"(Title: {title}) " + "\n".join(contents.split("\n")[1:])


# --- several worker processes on one port (retrieval.server.workers) -----------------------------------------------
@pytest.fixture(scope="module")
def bm25_index(corpus, tmp_path_factory) -> Path:
    from retrieval.bm25 import BM25Settings
    from retrieval.build_index import build_index

    out = tmp_path_factory.mktemp("bm25_index")
    build_index(BM25Settings(corpus_path=corpus), out, show_progress=False)
    return out


def _spawned_workers(proc: subprocess.Popen) -> list:
    import psutil

    workers = []
    for child in psutil.Process(proc.pid).children():
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                workers.append(child)
        except psutil.Error:  # gone, or dead and not yet reaped
            pass
    return workers


def _metrics_at(base: str, requests_counted: int) -> dict | None:
    """The server's metrics once its workers have counted `requests_counted` requests (None before)."""
    metrics = requests.get(f"{base}/metrics").json()
    return metrics if metrics["retrieval/requests"] >= requests_counted else None


def _wait_for(predicate, timeout_s: float, what: str):
    limit = scaled(timeout_s)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {limit:.0f} s waiting for {what}")


def test_workers_share_the_port_count_together_and_a_dead_worker_is_replaced(corpus, bm25_index):
    from concurrent.futures import ThreadPoolExecutor

    import psutil

    from sr1.launch.supervisor import free_port

    port = free_port()
    args = ["--method", "bm25", "--corpus", str(corpus), "--index", str(bm25_index), "--workers", "2"]
    proc = start_server([*args, "--cache-size", "0"], port)
    base = f"http://127.0.0.1:{port}"
    try:
        assert requests.get(f"{base}/health").json()["workers"] == 2
        (worker,) = _spawned_workers(proc)

        def ask(_: int) -> str:  # a fresh connection each time, so the kernel spreads them over the workers
            r = requests.post(f"{base}/retrieve", json={"queries": ["capital of France"], "topk": 1})
            return r.json()["result"][0][0]["id"] if r.ok else f"HTTP {r.status_code}"

        with ThreadPoolExecutor(8) as pool:
            assert set(pool.map(ask, range(64))) == {"paris"}
        # workers publish their counters every half second: wait until all 64 requests are counted
        metrics = _wait_for(lambda: _metrics_at(base, 64), 10, "the workers' counters")
        assert metrics["retrieval/workers"] == 2 and metrics["retrieval/requests"] == 64
        assert min(metrics["retrieval/worker_requests"]) > 0, metrics["retrieval/worker_requests"]

        worker.kill()  # its open connections are reset (clients retry); once it is gone, the other takes them all
        worker.wait(scaled(10))
        assert {ask(i) for i in range(8)} == {"paris"}
        (replacement,) = _wait_for(
            lambda: [w for w in _spawned_workers(proc) if w.pid != worker.pid], 30, "a replacement worker"
        )
        _wait_for(lambda: "restarting it" in "".join(proc.output_tail), 5, "the restart in the log")
        with ThreadPoolExecutor(8) as pool:
            assert set(pool.map(ask, range(64))) == {"paris"}
        metrics = _wait_for(lambda: _metrics_at(base, 136), 10, "the workers' counters")
        assert metrics["retrieval/requests"] == 136  # the dead worker's count carried over by its replacement
    finally:
        proc.terminate()
        assert proc.wait(scaled(15)) == 0
    assert not psutil.pid_exists(replacement.pid) or replacement.status() == psutil.STATUS_ZOMBIE


def test_workers_refuse_a_port_another_server_holds(corpus, bm25_index):
    import socket

    with socket.socket() as stale:  # a server that bound with SO_REUSEPORT would let a new pool in silently
        stale.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        stale.bind(("127.0.0.1", 0))
        stale.listen()
        port = stale.getsockname()[1]
        cmd = [
            sys.executable,
            "-m",
            "sr1.entrypoints.retrieval",
            "serve",
            "--method",
            "bm25",
            "--corpus",
            str(corpus),
            "--index",
            str(bm25_index),
            "--workers",
            "2",
            "--port",
            str(port),
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=scaled(120))
    assert done.returncode == 2
    assert f"cannot serve on 127.0.0.1:{port}: Address already in use" in done.stderr
