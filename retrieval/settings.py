"""The `retrieval` section: which retriever, and the server's, the client's and the reranker's settings.

    retrieval:
      retriever: {method: dense, corpus_path: wiki-18.jsonl, index_path: e5_Flat.index}   # or `retriever: bm25`
      topk: 3
      server: {port: 8000, workers: 0}
      client: {url: http://127.0.0.1:8000/retrieve, max_retries: 3}
      reranker: {enabled: false}

`MEMBERS` below is the retriever union: each member (`retrieval/union.py`) sits in its retriever's module with that
retriever's own knobs. `topk` and `token` are what the server and its clients share; the rest sits in the part that
reads it. The server, the index builder and the generators' client all read this section; the defaults are the
embedded CPU run (BM25, top-3, loopback).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from common.secrets import mask_url
from retrieval.bm25 import BM25Settings
from retrieval.dense import DenseSettings
from retrieval.online import BingSettings, BraveSettings, GoogleSettings, SerpApiSettings
from retrieval.union import (
    RETRIEVERS,
    IndexedSettings,
    RetrieverChoice,
    default_retriever,
    register_retriever,
)

# The retriever union, chosen by `retrieval.retriever.method`; the first member is the default. Adding a retriever:
# its module, holding its member (a `retrieval.union.RetrieverSettings` with a `build()`), and its line here.
MEMBERS = (
    BM25Settings,
    DenseSettings,
    GoogleSettings,
    BingSettings,
    BraveSettings,
    SerpApiSettings,
)
for _member in MEMBERS:
    register_retriever(_member)


def indexable_methods() -> list[str]:
    """The methods with an index to build (`sr1 retrieval build-index --method`): members extending
    `IndexedSettings`."""
    return [name for name, member in RETRIEVERS.items() if issubclass(member, IndexedSettings)]


class ServerConfig(BaseModel):
    """The retrieval server: where it listens, how it batches and caches, and what a request may ask."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", description="Bind address; loopback unless told otherwise.")
    port: int = Field(8000, ge=0, le=65535, description="Bind port (0: pick a free one and print it).")
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
    cache_mb: float = Field(
        256.0,
        ge=0,
        description="Memory the result cache may hold per server process, in MiB (estimated from its objects' sizes; "
        "the least recently used entries go first); 0 disables the cache. An entry is ~3 KB with top-3 wiki passages.",
    )
    workers: int = Field(
        0,
        ge=0,
        le=64,
        description="Server processes sharing the port (SO_REUSEPORT), each batching its own requests over the same "
        "memory-mapped index. 0: one per CPU core (at most 8) for bm25 with an index_path, else 1 (a dense "
        "encoder or GPU index is loaded once per worker).",
    )
    torch_threads: int = Field(
        0,
        ge=0,
        description="Intra-op CPU threads for the encoder, reranker and Flat scan (0: torch's default, all cores). "
        "On a CPU shared with other busy processes 1 is much faster: OpenMP barriers stall under oversubscription.",
    )
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="Largest request body accepted.")
    max_queries_per_request: int = Field(1024, ge=1, description="Most queries in one request.")
    max_query_chars: int = Field(4096, ge=1, description="Longest query in characters.")


class ClientConfig(BaseModel):
    """The generators' client of the server (and of a remote reranker): where it sends and how it retries."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field("http://127.0.0.1:8000/retrieve", description="Where clients send queries.")
    timeout_s: float = Field(10.0, gt=0, description="Timeout of one HTTP attempt.")
    max_retries: int = Field(3, ge=0, description="Retries after the first attempt fails.")
    backoff_s: float = Field(0.2, ge=0, description="First retry delay, doubled each retry.")


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


class RetrievalConfig(BaseModel):
    """The retrieval service: its retriever, its server, its clients and an optional reranker."""

    model_config = ConfigDict(extra="forbid")

    retriever: RetrieverChoice = Field(
        default_factory=default_retriever,
        description="The retriever, chosen by `method` ("
        + ", ".join(RETRIEVERS)
        + "), with its own settings; "
        "a bare method name (`retriever: dense`) takes its defaults.",
    )
    topk: int = Field(
        3, ge=1, description="Documents per search (and per request that names no topk; Search-R1: 3)."
    )
    token: str | None = Field(
        None,
        description="Bearer token the server requires on /retrieve and /rerank, and clients send (None: no auth). "
        "Printable ASCII without spaces (it travels in an HTTP header); an empty token is refused.",
    )
    server: ServerConfig = Field(default_factory=ServerConfig, description="The retrieval server.")
    client: ClientConfig = Field(default_factory=ClientConfig, description="The generators' client.")
    reranker: RerankerConfig = Field(
        default_factory=RerankerConfig, description="Optional cross-encoder reranker."
    )

    @property
    def reranks_searches(self) -> bool:
        """Whether the retrieval server reranks its own searches with its cross-encoder (no remote `url`)."""
        return self.reranker.enabled and bool(self.reranker.model) and self.reranker.url is None

    @property
    def serves_locally(self) -> bool:
        """Whether the retriever searches data on this machine, so a run starts a retrieval server for it (False
        for web search APIs)."""
        return self.retriever.local

    def served_at(self, port: int, host: str | None = None) -> RetrievalConfig:
        """This config with its server listening on `host` (None: `server.host`) at `port`, and its clients sending
        there (to 127.0.0.1 when no host is given)."""
        server = self.server.model_copy(update={"port": port, "host": host or self.server.host})
        return self.model_copy(update={"server": server}).sending_to(
            f"http://{host or '127.0.0.1'}:{port}/retrieve"
        )

    def sending_to(self, url: str) -> RetrievalConfig:
        """This config with its clients sending to `url`."""
        return self.model_copy(update={"client": self.client.model_copy(update={"url": url})})

    @field_validator("token")
    @classmethod
    def _token(cls, token: str | None) -> str | None:
        # an empty token would make the server require "Bearer " and lock every client out
        if token is not None and not token:
            raise ValueError("is empty; omit it (or set it to null) for no token")
        if token is not None and not all("!" <= c <= "~" for c in token):
            raise ValueError("must be printable ASCII without spaces: it is sent in the Authorization header")
        return token

    @model_validator(mode="after")
    def _check(self) -> RetrievalConfig:
        max_topk = self.server.max_topk
        if self.topk > max_topk:
            raise ValueError(
                f"retrieval.topk ({self.topk}) must be <= retrieval.server.max_topk ({max_topk})"
            )
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
        if reranker.enabled and reranker.url is not None and reranker.candidates > max_topk:
            raise ValueError(
                f"retrieval.reranker.candidates ({reranker.candidates}) must be <= retrieval.server.max_topk "
                f"({max_topk}): the generators ask /retrieve for that many documents before reranking them remotely"
            )
        if reranker.url is not None and not reranker.url.startswith(("http://", "https://")):
            raise ValueError(f"retrieval.reranker.url must be an http(s) URL, got {mask_url(reranker.url)!r}")
        return self
