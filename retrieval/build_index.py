"""Index building for `sr1 retrieval build-index`: BM25 (bm25s) or dense (encoder + faiss), with progress bars.

The output directory holds the index files, `sr1_index.json` (method, passage count, corpus, encoder) and the
corpus offsets cache, so `serve --index DIR` starts without rescanning the corpus. `INDEX_BUILDERS` below names the
methods with an index to build (the local ones of `retrieval.settings.METHODS`) and what builds each; the builders
import their module when called, so the CLI can list them without importing bm25s, torch or faiss.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from retrieval.corpus import DocStore
from retrieval.settings import RetrievalConfig


def _bm25(cfg: RetrievalConfig, store: DocStore, out: Path, show_progress: bool) -> None:
    from retrieval import bm25

    bm25.build_index_files(cfg, store, out, show_progress)


def _dense(cfg: RetrievalConfig, store: DocStore, out: Path, show_progress: bool) -> None:
    from retrieval import dense

    dense.build_index_files(cfg, store, out, show_progress)


# `retrieval.method` -> what writes its index into a directory; the local methods of `retrieval.settings.METHODS`
INDEX_BUILDERS: dict[str, Callable[[RetrievalConfig, DocStore, Path, bool], None]] = {
    "bm25": _bm25,
    "dense": _dense,
}


def indexable_methods() -> list[str]:
    """The methods `build-index` supports."""
    return list(INDEX_BUILDERS)


def build_index(cfg: RetrievalConfig, out: str | Path, show_progress: bool = True) -> int:
    """Build `cfg.method`'s index of `cfg.corpus_path` into `out`; returns the number of passages."""
    write = INDEX_BUILDERS.get(cfg.method)
    if write is None:
        raise ValueError(f"build_index supports {', '.join(INDEX_BUILDERS)}, not {cfg.method!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.corpus_path is None:
        raise ValueError("build_index needs retrieval.corpus_path")
    store = DocStore.open_cached(cfg.corpus_path, out)  # validates every line, caches offsets in out/
    write(cfg, store, out, show_progress)
    n = len(store)
    store.close()
    return n
