"""Index building for `sr1 retrieval build-index`: BM25 (bm25s) or dense (encoder + faiss), with progress bars.

The output directory holds the index files, `sr1_index.json` (method, passage count, corpus, encoder) and the
corpus offsets cache, so `serve --index DIR` starts without rescanning the corpus. Which methods have an index to
build, and the function that builds it, come from the registry `retrieval.settings.METHODS`.
"""

from __future__ import annotations

from pathlib import Path

from retrieval.corpus import DocStore
from retrieval.settings import METHODS, RetrievalConfig, retrieval_method


def indexable_methods() -> list[str]:
    """The methods `build-index` supports (those with a `build_index` entry in the registry)."""
    return [name for name, m in METHODS.items() if m.build_index is not None]


def build_index(cfg: RetrievalConfig, out: str | Path, show_progress: bool = True) -> int:
    """Build `cfg.method`'s index of `cfg.corpus_path` into `out`; returns the number of passages."""
    from common.imports import import_object

    target = retrieval_method(cfg.method).build_index
    if target is None:
        raise ValueError(f"build_index supports {', '.join(indexable_methods())}, not {cfg.method!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.corpus_path is None:
        raise ValueError("build_index needs retrieval.corpus_path")
    store = DocStore.open_cached(cfg.corpus_path, out)  # validates every line, caches offsets in out/
    import_object(target)(cfg, store, out, show_progress)
    n = len(store)
    store.close()
    return n
