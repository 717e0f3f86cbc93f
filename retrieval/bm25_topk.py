"""The exact BM25 top-k kernel of `retrieval.bm25`'s "pruned" scorer (MaxScore-style, over posting lists).

It reads bm25s's precomputed CSC score matrix (`model.scores`: `data`, `indices`, `indptr`) and is compiled with
numba (nogil, cached on disk) on first use by `pruned_kernel()`; without numba `retrieval.bm25` never calls it.
The plain-Python bodies (`*_py`) are what numba compiles; they also run, slowly, as ordinary Python.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


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


_KERNEL: Callable[..., int] | None = None
# the compiled helpers once `pruned_kernel()` ran (the kernel calls `_heap_topk` through this module's globals)
_heap_topk = _heap_topk_py
_postings_sorted = _postings_sorted_py


def pruned_kernel() -> Callable[..., int]:
    """The numba-compiled (nogil, disk-cached) pruned kernel (`_pruned_topk_py`), compiled on first use."""
    global _KERNEL, _heap_topk, _postings_sorted
    if _KERNEL is None:
        from numba import njit

        _postings_sorted = njit(nogil=True, cache=True)(_postings_sorted_py)
        _heap_topk = njit(nogil=True, cache=True)(_heap_topk_py)
        _KERNEL = njit(nogil=True, cache=True)(_pruned_topk_py)
    return _KERNEL


def postings_sorted(indices: np.ndarray, indptr: np.ndarray) -> bool:
    """Whether every posting list of the CSC matrix lists its documents in increasing order (compiled check)."""
    pruned_kernel()
    return bool(_postings_sorted(indices, indptr))
