"""BM25 retrieval with `bm25s` (numba backend when installed): build, save, load and batched search.

Scores follow Lucene's BM25 (bm25s `method="lucene"`) with Pyserini's k1=0.9, b=0.4, the setting of Search-R1's
Pyserini BM25 index. Passages are tokenised with English stop words removed and Snowball stemming.

Two scorers give the same hits (scores equal up to float32 rounding; ids may differ only among equal scores):
- "bm25s": bm25s's numba kernel fills a score array the size of the corpus per query and scans it for the top k,
  so its cost follows the corpus size and a batch costs as much as its queries one by one;
- "pruned" (the default with numba): our own nogil numba kernel over bm25s's precomputed CSC score matrix
  (`model.scores`), MaxScore-style: the query's rarest terms give the candidates, the common terms are looked up
  for the candidates only, and an upper bound on the common terms' scores proves when no other document can
  enter the top k (otherwise their posting lists are scanned too, still exactly). Its cost follows the rare
  terms' posting lists, and its corpus-sized scratch arrays are reused per thread instead of refilled per query.
The scorer is chosen per retriever (`self.scorer`), never per batch, so a query's hits never depend on the
batch it arrives in.
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
from typing import TypeVar

import numpy as np

from retrieval.base import Hits, LocalRetriever, hits_from_rows
from retrieval.corpus import DocStore

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


def _pruned_topk_py(
    q_terms: np.ndarray,
    q_counts: np.ndarray,
    q_ptr: np.ndarray,
    k: int,
    data: np.ndarray,
    indices: np.ndarray,
    indptr: np.ndarray,
    num_docs: int,
    upper: np.ndarray,
    budget: int,
    acc: np.ndarray,
    stamp: np.ndarray,
    cand: np.ndarray,
    stamp_base: int,
    out_docs: np.ndarray,
    out_scores: np.ndarray,
    out_n: np.ndarray,
) -> int:
    """Exact BM25 top-k per query from bm25s's CSC score matrix, touching only posting lists (MaxScore-style).

    Per query (terms unique, `q_counts` their occurrences): the rarest terms, up to `budget` posting entries (at
    least one term), are "essential": their documents are the candidates. The other terms' scores are added to the
    candidates only (binary search or a scan of the posting list, whichever is cheaper). If the k-th best candidate
    score beats the sum of the other terms' score upper bounds, no other document can enter the top k; otherwise
    the other terms' remaining documents are scored too, which is still exact. Writes positive-score hits best
    first into row q of `out_docs`/`out_scores`, their number into `out_n[q]`; returns how many queries fell back.
    `acc` (float32), `stamp` (int64, all below `stamp_base`) and `cand` (int64) are corpus-sized scratch arrays
    reused across calls: a document's `acc` entry counts only while its stamp is the current query's.
    """
    n_queries = len(q_ptr) - 1
    heap_v = np.empty(k, dtype=np.float32)
    heap_d = np.empty(k, dtype=np.int64)
    fallbacks = 0
    for q in range(n_queries):
        lo, hi = q_ptr[q], q_ptr[q + 1]
        nt = hi - lo
        terms = q_terms[lo:hi]
        counts = q_counts[lo:hi]
        dfs = indptr[terms + 1] - indptr[terms]
        order = np.argsort(dfs, kind="mergesort")
        # stamps: a candidate of this query / a document first found in the fallback
        seen, extra = stamp_base + 2 * q, stamp_base + 2 * q + 1
        n_c = 0
        spent = 0
        n_ess = 0
        for j in range(nt):
            t = terms[order[j]]
            df = indptr[t + 1] - indptr[t]
            if n_ess > 0 and spent + df > budget:
                break
            spent += df
            n_ess += 1
            c = counts[order[j]]
            for p in range(indptr[t], indptr[t + 1]):
                doc = indices[p]
                if stamp[doc] != seen:
                    stamp[doc] = seen
                    acc[doc] = 0.0
                    cand[n_c] = doc
                    n_c += 1
                for _ in range(c):  # bm25s adds a term's score once per occurrence in the query
                    acc[doc] += data[p]
        bound = 0.0
        for j in range(n_ess, nt):
            bound += upper[terms[order[j]]] * counts[order[j]]
        # Float sums of upper bounds may round; a small margin keeps the pruning conservative.
        slack = bound * 1.0001 + 1e-6
        n_keep = n_c
        if n_ess < nt:
            # Scores only grow as terms are added, so the k-th best essential-only score is a lower bound of the
            # final k-th best: a candidate that cannot reach it even with every other term is dropped unscored.
            n_h = _heap_topk(acc, cand, n_c, heap_v, heap_d)
            if n_h == k:
                floor = heap_v[0]
                n_keep = 0
                for i in range(n_c):
                    if acc[cand[i]] + slack >= floor:
                        cand[n_keep] = cand[i]
                        n_keep += 1
        for j in range(n_ess, nt):
            t = terms[order[j]]
            c = counts[order[j]]
            start, end = indptr[t], indptr[t + 1]
            df = end - start
            if n_keep * (np.log2(df + 1.0) + 1.0) < df:
                postings = indices[start:end]
                for i in range(n_keep):
                    doc = cand[i]
                    pos = np.searchsorted(postings, doc)
                    if pos < df and postings[pos] == doc:
                        for _ in range(c):
                            acc[doc] += data[start + pos]
            else:
                for p in range(start, end):
                    doc = indices[p]
                    if stamp[doc] == seen:
                        for _ in range(c):
                            acc[doc] += data[p]
        n_c = n_keep
        n_h = _heap_topk(acc, cand, n_c, heap_v, heap_d)
        threshold = heap_v[0] if n_h == k else 0.0
        if n_ess < nt and not (n_h == k and slack < threshold):
            fallbacks += 1
            n_c0 = n_c
            for j in range(n_ess, nt):
                t = terms[order[j]]
                c = counts[order[j]]
                for p in range(indptr[t], indptr[t + 1]):
                    doc = indices[p]
                    st = stamp[doc]
                    if st == seen:
                        continue  # already has this term's score
                    if st != extra:
                        stamp[doc] = extra
                        acc[doc] = 0.0
                        cand[n_c] = doc
                        n_c += 1
                    for _ in range(c):
                        acc[doc] += data[p]
            n_h = _heap_topk(acc, cand[n_c0:], n_c - n_c0, heap_v, heap_d, n_h)
        order_h = np.argsort(-heap_v[:n_h], kind="mergesort")
        m = 0
        for i in order_h:
            if heap_v[i] > 0:
                out_docs[q, m] = heap_d[i]
                out_scores[q, m] = heap_v[i]
                m += 1
        out_n[q] = m
    return fallbacks


def _heap_topk_py(
    acc: np.ndarray, cand: np.ndarray, n_c: int, heap_v: np.ndarray, heap_d: np.ndarray, n_h: int = 0
) -> int:
    """Push the scores of `cand[:n_c]` into the min-heap (`heap_v`, `heap_d`, `n_h` filled) of capacity k."""
    k = len(heap_v)
    for i in range(n_c):
        doc = cand[i]
        v = acc[doc]
        if n_h < k:
            pos = n_h
            n_h += 1
            while pos > 0:  # sift up
                parent = (pos - 1) >> 1
                if heap_v[parent] <= v:
                    break
                heap_v[pos] = heap_v[parent]
                heap_d[pos] = heap_d[parent]
                pos = parent
            heap_v[pos] = v
            heap_d[pos] = doc
        elif v > heap_v[0]:
            pos = 0
            while True:  # sift the new root down
                child = 2 * pos + 1
                if child >= k:
                    break
                if child + 1 < k and heap_v[child + 1] < heap_v[child]:
                    child += 1
                if heap_v[child] >= v:
                    break
                heap_v[pos] = heap_v[child]
                heap_d[pos] = heap_d[child]
                pos = child
            heap_v[pos] = v
            heap_d[pos] = doc
    return n_h


def _postings_sorted_py(indices: np.ndarray, indptr: np.ndarray) -> bool:
    """Whether every posting list lists its documents in increasing order (the binary search needs it)."""
    for t in range(len(indptr) - 1):
        for p in range(indptr[t] + 1, indptr[t + 1]):
            if indices[p] <= indices[p - 1]:
                return False
    return True


_KERNEL: object | None = None


def _pruned_kernel() -> object:
    """The numba-compiled (nogil, disk-cached) pruned kernel, compiled on first use."""
    global _KERNEL, _heap_topk, _postings_sorted
    if _KERNEL is None:
        from numba import njit

        _postings_sorted = njit(nogil=True, cache=True)(_postings_sorted_py)
        _heap_topk = njit(nogil=True, cache=True)(_heap_topk_py)
        _KERNEL = njit(nogil=True, cache=True)(_pruned_topk_py)
    return _KERNEL


_heap_topk = _heap_topk_py
_postings_sorted = _postings_sorted_py


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
