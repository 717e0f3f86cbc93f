"""Index building for `sr1 retrieval build-index`: any retriever of the union with an index to write.

The output directory holds the index files, `sr1_index.json` (method, passage count, corpus, encoder) and the
corpus offsets cache, so `serve --index DIR` starts without rescanning the corpus. Which retrievers have an index
to build is what the union says (`retrieval.settings.indexable_methods`: the members extending `IndexedSettings`).
"""

from __future__ import annotations

from pathlib import Path

from retrieval.corpus import DocStore
from retrieval.settings import indexable_methods
from retrieval.union import IndexedSettings, RetrieverSettings


def build_index(settings: RetrieverSettings, out: str | Path, show_progress: bool = True) -> int:
    """Build the index `settings` describe (a member of the retriever union) of its corpus into `out`; returns the
    number of passages. ValueError naming the methods with an index for any other member, or without a corpus."""
    if not isinstance(settings, IndexedSettings):
        raise ValueError(
            f"build-index supports --method {' or '.join(indexable_methods())}, not {settings.method!r}"
        )
    if settings.corpus_path is None:
        raise ValueError("build-index needs a corpus (--corpus, retrieval.retriever.corpus_path)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with DocStore.open_cached(
        settings.corpus_path, out
    ) as store:  # validates every line, caches offsets in out/
        settings.write_index(store, out, show_progress)
        return len(store)
