"""BM25 retrieval with `bm25s` (numba backend when installed): build, save, load and batched search.

Scores follow Lucene's BM25 (bm25s `method="lucene"`) with Pyserini's k1=0.9, b=0.4, the setting of Search-R1's
Pyserini BM25 index. Passages are tokenised with English stop words removed and Snowball stemming.

Two scorers give the same hits (scores equal up to float32 rounding; ids may differ only among equal scores):
- "bm25s": bm25s's numba kernel fills a score array the size of the corpus per query and scans it for the top k,
  so its cost follows the corpus size and a batch costs as much as its queries one by one;
- "pruned" (the default with numba): our own nogil numba kernel (`retrieval.bm25_topk`) over bm25s's
  precomputed CSC score matrix (`model.scores`), MaxScore-style: the query's rarest terms give the candidates, the
  common terms are looked up for the candidates only, and an upper bound on the common terms' scores proves when
  no other document can enter the top k (otherwise their posting lists are scanned too, still exactly). Its cost
  follows the rare terms' posting lists, and its corpus-sized scratch arrays are reused per thread instead of
  refilled per query.
The scorer is chosen per retriever (`self.scorer`), never per batch, so a query's hits never depend on the
batch it arrives in.

An empty or whitespace-only query gets the first k passages of the corpus, in corpus order, with score 0.0: every
passage scores 0 for it (bm25s's own retrieve answers a query without terms with the same k passages, rows k-1..0,
all scored 0), and Search-R1's server answers an empty query with top-k documents like any other. A non-empty
query whose words are all stop words or absent from the index matches no passage and gets no documents.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, TypeVar

import numpy as np
from pydantic import Field

from retrieval.base import Hits, LocalRetriever, hits_from_rows
from retrieval.bm25_topk import postings_sorted as _postings_sorted
from retrieval.bm25_topk import pruned_kernel as _pruned_kernel
from retrieval.corpus import DocStore
from retrieval.union import IndexedSettings

log = logging.getLogger(__name__)

META_FILE = "sr1_index.json"
T = TypeVar("T")

# The pruned scorer takes a query's rarest terms, up to this fraction of the corpus size in posting entries, as
# the terms whose documents are the candidates (at least one term, and at least PRUNED_MIN_ESSENTIAL entries).
PRUNED_ESSENTIAL_FRACTION = 1 / 32
PRUNED_MIN_ESSENTIAL = 1024


def _backend() -> str:
    try:
        import numba  # noqa: F401
    except ImportError:
        return "auto"
    return "numba"


def _enable_numba_cache() -> None:
    """Cache bm25s's serial numba kernel on disk: compiling it takes 5-20 s per process on a small CPU.

    Only the serial (nogil) dispatcher is cached: the parallel one wraps the same Python function and would
    share, and could swap, the cache entry.
    """
    try:
        from bm25s.numba import retrieve_utils
    except ImportError:
        return
    dispatcher = getattr(retrieve_utils, "_retrieve_internal_jitted_serial", None)
    if dispatcher is not None and hasattr(dispatcher, "enable_caching"):
        try:
            dispatcher.enable_caching()
        except Exception:  # noqa: BLE001 - an unwritable cache dir only costs compile time
            log.debug("numba caching unavailable")


def _stopwords() -> frozenset[str]:
    from bm25s.tokenization import _infer_stopwords

    return frozenset(_infer_stopwords("en"))


def _stemmer() -> object:
    import Stemmer

    return Stemmer.Stemmer("english")


class BM25Retriever(LocalRetriever):
    """Sparse retrieval over a `DocStore`; document numbers are corpus rows."""

    name = "bm25"

    def __init__(self, model: object, store: DocStore, threads: int = 0):
        self.model = model
        self.store = store
        self.stemmer = _stemmer()
        self.backend = _backend()
        if self.backend == "numba":
            _enable_numba_cache()
        # A batch is split across `threads` threads, each running bm25s's serial numba kernel, which releases
        # the GIL (bm25s's parallel kernel holds it, which would stall the server's event loop while it scores).
        self.threads = threads or (os.cpu_count() or 1)
        self._pool: ThreadPoolExecutor | None = None
        self._split = re.compile(r"(?u)\b\w\w+\b").findall  # bm25s's default splitter
        self._stopwords = _stopwords()
        self._word_ids: dict[str, int] = {}  # query word -> index term id (-1: stop word or unknown)
        self._upper: np.ndarray | None = None  # largest score of each term, for the pruned scorer
        # "pruned" (own posting-list kernel, needs numba) or "bm25s" (bm25s's corpus-sized scan per query)
        self.scorer = "pruned" if self.backend == "numba" else "bm25s"
        self._scratch = threading.local()  # per-thread corpus-sized arrays of the pruned kernel
        self.fallbacks = 0  # pruned queries whose top k needed the common terms' full posting lists

    # -- building ------------------------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        store: DocStore,
        k1: float = 0.9,
        b: float = 0.4,
        threads: int = 0,
        show_progress: bool = False,
        chunk: int = 200_000,
    ) -> BM25Retriever:
        """Index every passage of `store` (in chunks, so the texts of a large corpus never all sit in memory)."""
        import bm25s

        stemmer = _stemmer()
        texts_iter: Iterable[str] = store.iter_contents()
        if show_progress:
            from rich.progress import track

            texts_iter = track(texts_iter, total=len(store), description="bm25: tokenizing")
        # bm25s.tokenize needs the whole list to build one vocabulary; for very large corpora we tokenise in chunks
        # with a shared vocabulary by re-using the Tokenizer object.
        tokenizer = bm25s.tokenization.Tokenizer(stopwords="en", stemmer=stemmer)
        ids: list[list[int]] = []
        buf: list[str] = []
        for text in texts_iter:
            buf.append(text)
            if len(buf) >= chunk:
                ids.extend(tokenizer.tokenize(buf, update_vocab=True, return_as="ids", show_progress=False))
                buf = []
        if buf:
            ids.extend(tokenizer.tokenize(buf, update_vocab=True, return_as="ids", show_progress=False))
        model = bm25s.BM25(k1=k1, b=b, method="lucene", backend=_backend())
        model.index(
            bm25s.tokenization.Tokenized(ids=ids, vocab=tokenizer.get_vocab_dict()),
            show_progress=show_progress,
        )
        return cls(model, store, threads=threads)

    def save(self, out_dir: str | Path) -> None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.model.save(str(out_dir), show_progress=False)
        meta = {"method": "bm25", "num_docs": len(self.store), "corpus_path": str(self.store.path.resolve())}
        (out_dir / META_FILE).write_text(json.dumps(meta, indent=2))

    @classmethod
    def load(
        cls, index_dir: str | Path, store: DocStore, threads: int = 0, mmap: bool = True
    ) -> BM25Retriever:
        import bm25s

        index_dir = Path(index_dir)
        meta_path = index_dir / META_FILE
        if meta_path.exists():
            meta = json.loads(meta_path.read_text())
            if meta.get("method") != "bm25":
                raise ValueError(f"{index_dir} holds a {meta.get('method')!r} index, not bm25")
            if meta.get("num_docs") != len(store):
                raise ValueError(
                    f"BM25 index {index_dir} covers {meta.get('num_docs')} passages but corpus {store.path} has "
                    f"{len(store)}: rebuild the index for this corpus"
                )
        model = bm25s.BM25.load(str(index_dir), mmap=mmap, show_progress=False)
        return cls(model, store, threads=threads)

    def warmup(self) -> None:
        """JIT-compile (or load from the disk cache) the numba kernels before the first request."""
        vocab = self.model.vocab_dict
        if not vocab:
            return
        token = next(iter(vocab.values()))
        if self._use_pruned():
            self._score_pruned([[token]] * 2, 1)
        else:
            self._score([[token]] * 2, 1)

    # -- searching -----------------------------------------------------------------------------------------
    def _score(self, query_ids: list[list[int]], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows and scores per query; large batches are scored in chunks on `threads` threads."""

        def run(chunk: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
            rows, scores = self.model.retrieve(
                chunk, k=k, backend_selection=self.backend, n_threads=1, show_progress=False
            )
            return np.asarray(rows), np.asarray(scores, dtype=np.float32)

        parts = self._in_chunks(run, query_ids)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def _in_chunks(self, run: Callable[[list[list[int]]], T], query_ids: list[list[int]]) -> list[T]:
        """`run` over the batch, in one call or (for 16+ queries) split in chunks on `threads` threads; returns
        each chunk's result in order."""
        n_chunks = min(self.threads, len(query_ids) // 8)
        if n_chunks <= 1:
            return [run(query_ids)]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="bm25")
        size = -(-len(query_ids) // n_chunks)
        return list(self._pool.map(run, [query_ids[i : i + size] for i in range(0, len(query_ids), size)]))

    def _use_pruned(self) -> bool:
        """Whether the pruned scorer serves this index (its first use checks the posting lists, and an index
        whose lists are not sorted falls back to bm25s's scorer for good)."""
        if self.scorer == "pruned":
            self._pruned_arrays()
        return self.scorer == "pruned"

    def _pruned_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, np.ndarray]:
        """bm25s's CSC score matrix (shared, not copied) and each term's largest score, computed once."""
        if self._upper is None:
            sc = self.model.scores
            data, indptr = np.asarray(sc["data"]), np.asarray(sc["indptr"])
            df = np.diff(indptr)
            upper = np.zeros(len(df), dtype=np.float32)
            nonempty = df > 0
            if len(data):
                upper[nonempty] = np.maximum.reduceat(data, indptr[:-1][nonempty])
            self._upper = upper
            _pruned_kernel()
            if not _postings_sorted(np.asarray(sc["indices"]), indptr):
                # an index whose posting lists are not sorted (written by another bm25s) gets the old scorer
                log.warning("bm25 index posting lists are not sorted by document: using bm25s's scorer")
                self.scorer = "bm25s"
        sc = self.model.scores
        return (
            np.asarray(sc["data"]),
            np.asarray(sc["indices"]),
            np.asarray(sc["indptr"]),
            int(sc["num_docs"]),
            self._upper,
        )

    def _score_pruned(self, query_ids: list[list[int]], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Top-k (rows, scores) per query, positive scores only, best first; chunks run on `threads` threads."""
        data, indices, indptr, num_docs, upper = self._pruned_arrays()
        kernel = _pruned_kernel()
        budget = max(PRUNED_MIN_ESSENTIAL, int(PRUNED_ESSENTIAL_FRACTION * num_docs))

        def run(chunk: list[list[int]]) -> list[tuple[np.ndarray, np.ndarray]]:
            # each query's distinct term ids (sorted) and how often each occurs; plain Python is several
            # times cheaper than np.unique on a handful of ids, and this runs under the GIL once per query
            terms: list[int] = []
            counts: list[int] = []
            ptr = [0]
            for q in chunk:
                tally: dict[int, int] = {}
                for t in q:
                    tally[t] = tally.get(t, 0) + 1
                for t in sorted(tally):
                    terms.append(t)
                    counts.append(tally[t])
                ptr.append(len(terms))
            docs = np.zeros((len(chunk), k), dtype=np.int64)
            scores = np.zeros((len(chunk), k), dtype=np.float32)
            n = np.zeros(len(chunk), dtype=np.int64)
            scratch = getattr(self._scratch, "arrays", None)
            if scratch is None or len(scratch[0]) != num_docs:
                scratch = (
                    np.zeros(num_docs, dtype=np.float32),
                    np.full(num_docs, -1, dtype=np.int64),
                    np.empty(num_docs, dtype=np.int64),
                    [0],  # next free stamp
                )
                self._scratch.arrays = scratch
            acc, stamp, cand, base = scratch
            self.fallbacks += kernel(
                np.asarray(terms, dtype=np.int64),
                np.asarray(counts, dtype=np.int64),
                np.asarray(ptr, dtype=np.int64),
                k,
                data,
                indices,
                indptr,
                num_docs,
                upper,
                budget,
                acc,
                stamp,
                cand,
                base[0],
                docs,
                scores,
                n,
            )
            base[0] += 2 * len(chunk)
            return [(docs[i, : n[i]], scores[i, : n[i]]) for i in range(len(chunk))]

        return [hit for part in self._in_chunks(run, query_ids) for hit in part]

    def query_term_ids(self, query: str) -> list[int]:
        """Index term ids of a query, tokenised as bm25s tokenised the corpus (lower-case, \\w\\w+ words, English
        stop words removed, Snowball stems); words the index does not know are dropped."""
        if len(self._word_ids) > 1_000_000:
            self._word_ids.clear()
        ids = []
        for word in self._split(query.lower()):
            tid = self._word_ids.get(word)
            if tid is None:
                tid = (
                    -1
                    if word in self._stopwords
                    else self.model.vocab_dict.get(self.stemmer.stemWord(word), -1)
                )
                self._word_ids[word] = tid
            if tid >= 0:
                ids.append(tid)
        return ids

    def search(self, queries: list[str], topk: int) -> list[Hits]:
        if not queries:
            return []
        n_docs = len(self.store)
        k = max(1, min(topk, n_docs))
        query_ids = [self.query_term_ids(q) for q in queries]
        out: list[Hits] = [Hits() for _ in queries]
        blank = [i for i, q in enumerate(queries) if not q.strip()]
        if blank:  # every passage scores 0: the first k of the corpus (see the module docstring)
            first = np.arange(min(topk, n_docs), dtype=np.int64)
            zeros = np.zeros(len(first), dtype=np.float32)
            for i, hits in zip(blank, hits_from_rows(self.store, [(first, zeros)] * len(blank)), strict=True):
                out[i] = hits
        live = [i for i, q in enumerate(query_ids) if q]
        if not live:
            return out
        if self._use_pruned():
            ranked = self._score_pruned([query_ids[i] for i in live], k)
        else:
            rows, scores = self._score([query_ids[i] for i in live], k)
            keep = scores > 0  # a passage sharing no term with the query is not a hit
            ranked = [(r[m], s[m]) for r, s, m in zip(rows, scores, keep, strict=True)]
        for qi, hits in zip(live, hits_from_rows(self.store, ranked), strict=True):
            out[qi] = hits
        return out


# -- its member of the retriever union (`retrieval/union.py`) -------------------------------------------------------
class BM25Settings(IndexedSettings):
    """BM25 over the corpus: an index directory from `build-index`, or the corpus indexed in memory at start."""

    method: Literal["bm25"] = Field("bm25", description="Which retriever (the union's tag).")
    k1: float = Field(0.9, gt=0, description="BM25 k1 (Pyserini's default, as in Search-R1's BM25).")
    b: float = Field(0.4, ge=0, le=1, description="BM25 b (Pyserini's default).")
    threads: int = Field(
        0,
        ge=0,
        description="Scoring threads per server process (0: the cores, shared between the processes).",
    )

    def build(self, show_progress: bool = False) -> BM25Retriever:
        store = self.open_store()
        if self.index_path is not None:
            return BM25Retriever.load(self.index_path, store, threads=self.threads)
        log.info("no retrieval.retriever.index_path: indexing %d passages with BM25 in memory", len(store))
        return BM25Retriever.build(
            store, k1=self.k1, b=self.b, threads=self.threads, show_progress=show_progress
        )

    def write_index(self, store: DocStore, out: Path, show_progress: bool = True) -> None:
        BM25Retriever.build(store, k1=self.k1, b=self.b, show_progress=show_progress).save(out)

    def shares_index(self) -> bool:
        return (
            self.index_path is not None
        )  # bm25s's score matrix, the corpus and its offsets are memory-mapped

    def for_workers(self, workers: int) -> BM25Settings:
        if self.threads:
            return self
        return self.model_copy(update={"threads": max(1, (os.cpu_count() or 1) // workers)})
