"""Dense retrieval: a text encoder (`retrieval/encoder.py`) and a faiss inner-product index, and its settings.

Embeddings are L2-normalised and the index is inner product, so scores are cosines. Indexes: any faiss factory
string (`Flat`, `HNSW64`, `IVF4096,Flat`), moved to the GPUs when GPU faiss is present. Search-R1's prebuilt
`e5_Flat.index` (e5-base-v2 over wiki-18) loads as is: pass the `.index` file as the index path with `wiki-18.jsonl`
as the corpus. `DenseSettings` is its member of the retriever union (`retrieval.retriever: {method: dense, ...}`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from retrieval.base import Hits, LocalRetriever, hits_from_rows
from retrieval.corpus import DocStore
from retrieval.encoder import Encoder, EncoderConfig
from retrieval.union import IndexedSettings

log = logging.getLogger(__name__)

META_FILE = "sr1_index.json"
FAISS_FILE = "index.faiss"


def make_index(dim: int, factory: str) -> object:
    import faiss

    return faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)


def to_gpu_if_available(index: object, enabled: bool) -> object:
    """Move the index to all GPUs when GPU faiss is installed and a GPU is visible (sharded, so a 62 GB Flat fits)."""
    import faiss

    if not enabled or not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
        return index
    co = faiss.GpuMultipleClonerOptions()
    co.shard = True
    co.useFloat16 = True
    log.info("moving faiss index to %d GPU(s)", faiss.get_num_gpus())
    return faiss.index_cpu_to_all_gpus(index, co=co)


def build_dense_index(
    store: DocStore,
    encoder: Encoder,
    factory: str = "Flat",
    show_progress: bool = False,
    embeddings_cache: str | Path | None = None,
) -> tuple[object, np.ndarray | None]:
    """Encode every passage and add it to a new faiss index; returns (index, embeddings or None).

    `embeddings_cache` (a .npy path) is reused when it exists with the right shape, so a benchmark or a second
    index type over the same corpus encodes the passages once.
    """
    n = len(store)
    emb: np.ndarray | None = None
    if embeddings_cache is not None and Path(embeddings_cache).exists():
        cached = np.load(embeddings_cache, mmap_mode="r")
        if cached.shape == (n, encoder.dim):
            emb = np.asarray(cached, dtype=np.float32)
    if emb is None:
        emb = np.zeros((n, encoder.dim), dtype=np.float32)
        bs = encoder.cfg.batch_size
        starts: Iterable[int] = range(0, n, bs)
        if show_progress:
            from rich.progress import track

            starts = track(starts, total=(n + bs - 1) // bs, description="dense: encoding passages")
        for s in starts:
            rows = range(s, min(n, s + bs))
            emb[s : s + len(rows)] = encoder.encode_passages(
                [store.get(i)["contents"] for i in rows], batch_size=bs
            )
        if embeddings_cache is not None:
            Path(embeddings_cache).parent.mkdir(parents=True, exist_ok=True)
            np.save(embeddings_cache, emb)
    index = make_index(encoder.dim, factory)
    if not index.is_trained:
        sample = emb[np.random.default_rng(0).permutation(n)[: min(n, 256 * 1024)]]
        index.train(sample)
    index.add(emb)
    return index, emb


def _flat_ip_view(index: object) -> object | None:
    """A zero-copy torch view of a CPU flat inner-product index's vectors, or None for other index types."""
    import faiss
    import torch

    if (
        type(index).__name__ not in ("IndexFlatIP", "IndexFlat")
        or index.metric_type != faiss.METRIC_INNER_PRODUCT
    ):
        return None
    if index.ntotal == 0:
        return None
    xb = faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d)  # faiss's own memory, no copy
    return torch.from_numpy(np.asarray(xb).reshape(index.ntotal, index.d))


def _exact_ip_search(xb: object, q: np.ndarray, k: int, max_scores: int = 64 * 1024 * 1024) -> tuple:
    """Exact top-k by inner product with torch's BLAS, the database scanned in chunks with a running top-k.

    Same result as faiss's IndexFlatIP.search (up to float rounding); on CPUs it is several times faster for
    batches because torch's MKL/oneDNN GEMM beats faiss-cpu's BLAS, and chunking bounds the score matrix to
    `max_scores` floats even for 21M passages.
    """
    import torch

    qt = torch.from_numpy(np.ascontiguousarray(q))
    n = xb.shape[0]
    chunk = max(k, max_scores // max(1, qt.shape[0]))
    best_s = best_i = None
    with torch.inference_mode():
        for start in range(0, n, chunk):
            s = qt @ xb[start : start + chunk].T
            v, i = torch.topk(s, min(k, s.shape[1]), dim=1)
            i = i + start
            if best_s is None:
                best_s, best_i = v, i
            else:
                cat_s, cat_i = torch.cat([best_s, v], 1), torch.cat([best_i, i], 1)
                best_s, pos = torch.topk(cat_s, min(k, cat_s.shape[1]), dim=1)
                best_i = torch.gather(cat_i, 1, pos)
    return best_s.numpy(), best_i.numpy()


class DenseRetriever(LocalRetriever):
    """Encoder + faiss index + doc store; faiss row i is corpus row i (Search-R1's convention)."""

    name = "dense"

    def __init__(self, encoder: Encoder, index: object, store: DocStore, cfg: DenseSettings | None = None):
        import faiss

        if index.ntotal != len(store):
            raise ValueError(
                f"faiss index holds {index.ntotal} vectors but corpus {store.path} has {len(store)} passages"
            )
        if index.d != encoder.dim:
            raise ValueError(f"faiss index dimension {index.d} differs from the encoder's {encoder.dim}")
        cfg = cfg or DenseSettings()
        # query-time knobs for approximate indexes
        base = (
            faiss.downcast_index(index.index)
            if hasattr(index, "index") and isinstance(index, faiss.IndexPreTransform)
            else index
        )
        if hasattr(base, "hnsw"):
            base.hnsw.efSearch = cfg.hnsw_ef_search
        if hasattr(base, "nprobe"):
            base.nprobe = cfg.ivf_nprobe
        self.encoder = encoder
        self.index = to_gpu_if_available(index, cfg.faiss_gpu)
        self.store = store
        self._flat = _flat_ip_view(self.index) if cfg.flat_search in ("auto", "torch") else None
        if cfg.flat_search == "torch" and self._flat is None:
            raise ValueError(
                "retrieval.retriever.flat_search='torch' needs a CPU IndexFlatIP (e.g. e5_Flat.index)"
            )

    def save(self, out_dir: str | Path) -> None:
        import faiss

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        index = self.index
        if hasattr(faiss, "index_gpu_to_cpu") and "Gpu" in type(index).__name__:
            index = faiss.index_gpu_to_cpu(index)
        faiss.write_index(index, str(out_dir / FAISS_FILE))
        meta = {
            "method": "dense",
            "num_docs": len(self.store),
            "corpus_path": str(self.store.path.resolve()),
            "encoder": self.encoder.cfg.model,
            "dim": self.encoder.dim,
        }
        (out_dir / META_FILE).write_text(json.dumps(meta, indent=2))

    @staticmethod
    def read_index(index_path: str | Path) -> object:
        """Read `DIR/index.faiss` or a bare faiss file (e.g. Search-R1's e5_Flat.index)."""
        import faiss

        p = Path(index_path)
        f = p / FAISS_FILE if p.is_dir() else p
        if not f.exists():
            raise FileNotFoundError(
                f"no faiss index at {f} (expected a build-index directory or a .index file)"
            )
        return faiss.read_index(str(f))

    def search(self, queries: list[str], topk: int) -> list[Hits]:
        if not queries:
            return []
        k = max(1, min(topk, len(self.store)))
        q = self.encoder.encode_queries(list(queries))
        if self._flat is not None:
            scores, rows = _exact_ip_search(self._flat, q, k)
        else:
            scores, rows = self.index.search(q, k)
        keep = rows >= 0  # faiss pads with -1 when fewer than k vectors are reachable
        return hits_from_rows(self.store, [(r[m], s[m]) for r, s, m in zip(rows, scores, keep, strict=True)])


# -- its member of the retriever union (`retrieval/union.py`) -------------------------------------------------------
class DenseSettings(IndexedSettings):
    """Dense retrieval: an encoder and a faiss index (a build-index directory or a faiss file such as Search-R1's
    e5_Flat.index), or the corpus encoded in memory at start. An empty query is encoded like any other."""

    uses_torch = True

    method: Literal["dense"] = Field("dense", description="Which retriever (the union's tag).")
    encoder: EncoderConfig = Field(default_factory=EncoderConfig, description="The text encoder.")
    faiss_index: str = Field(
        "Flat", description="faiss factory string of a new index: 'Flat', 'HNSW64', 'IVF4096,Flat', ..."
    )
    flat_search: Literal["auto", "faiss", "torch"] = Field(
        "auto",
        description="Exact search on a CPU Flat inner-product index: 'auto'/'torch' scan it with torch's GEMM "
        "(zero-copy, chunked; much faster than faiss-cpu for batches), 'faiss' uses faiss's own search.",
    )
    faiss_gpu: bool = Field(True, description="Move the faiss index to the GPUs when GPU faiss is present.")
    hnsw_ef_search: int = Field(128, ge=1, description="HNSW efSearch at query time.")
    ivf_nprobe: int = Field(32, ge=1, description="IVF nprobe at query time.")

    def build(self, show_progress: bool = False) -> DenseRetriever:
        store = self.open_store()
        encoder = Encoder(self.encoder)
        if self.index_path is not None:
            index = DenseRetriever.read_index(self.index_path)
        else:
            log.info(
                "no retrieval.retriever.index_path: encoding %d passages in memory (%s)",
                len(store),
                self.faiss_index,
            )
            index, _ = build_dense_index(store, encoder, self.faiss_index, show_progress=show_progress)
        return DenseRetriever(encoder, index, store, self)

    def write_index(self, store: DocStore, out: Path, show_progress: bool = True) -> None:
        encoder = Encoder(self.encoder)
        index, _ = build_dense_index(store, encoder, self.faiss_index, show_progress=show_progress)
        DenseRetriever(encoder, index, store, self.model_copy(update={"faiss_gpu": False})).save(out)
