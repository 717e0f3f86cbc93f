"""The retriever union: what every retriever's settings are, and how `retrieval.retriever` picks one by `method`.

    retrieval:
      retriever: {method: bm25, corpus_path: wiki-18.jsonl, k1: 0.9}        # or just `retriever: bm25`

Each retriever's settings are a member: a `RetrieverSettings` subclass in the retriever's own module, holding only
that retriever's knobs, with `method` (a `Literal`) as its tag and a `build()` that makes the retriever. Its line in
`retrieval/settings.py` registers it; everything else (the config's validation and reference, `build_retriever`,
`sr1 retrieval build-index`, the CLI's `--method` choices) reads `RETRIEVERS`, so adding a retriever is its module
and that one line. A retriever defined outside the package registers the same way (`register_retriever`).

The union is open: `RETRIEVERS` is filled when `retrieval.settings` is imported, and a config is checked against
the members registered when it is loaded. Unknown methods and another member's knobs fail naming what is known.
Members' modules import their heavy libraries (bm25s, transformers, faiss, aiohttp) inside functions, so a
retriever's settings load without them. The family's machinery is `common/variants.py`, the same for every variant
family (algorithms, corrections, tasks).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from common.variants import Family
from retrieval.base import Retriever
from retrieval.corpus import DocStore

TAG = "method"


class RetrieverSettings(BaseModel):
    """Base of every member of the retriever union: its tag, and what the service asks of it."""

    model_config = ConfigDict(extra="forbid")

    # searches data on this machine, so `sr1 run` starts a retrieval server for it (False: a web search API)
    local: ClassVar[bool] = True
    # loads torch (an encoder): the server applies `retrieval.server.torch_threads` before building it
    uses_torch: ClassVar[bool] = False

    method: str = Field(description="Which retriever (the union's tag).")

    def build(self, show_progress: bool = False) -> Retriever:
        """The retriever these settings describe, loaded (indexes read or built, models loaded)."""
        raise NotImplementedError(f"{type(self).__name__} does not say how to build its retriever")

    def shares_index(self) -> bool:
        """Whether server processes on one port share one copy of the index (memory-mapped), so that
        `retrieval.server.workers: 0` starts one per core rather than one."""
        return False

    def for_workers(self, workers: int) -> RetrieverSettings:
        """These settings for one of `workers` server processes sharing the machine's cores."""
        return self


class CorpusSettings(RetrieverSettings):
    """A retriever that searches a local corpus (Search-R1's wiki-18 JSONL)."""

    corpus_path: Path | None = Field(
        None, description="Corpus JSONL ({'id', 'contents': '\"Title\"\\ntext'}, Search-R1 wiki-18 format)."
    )

    def open_store(self) -> DocStore:
        """The corpus `corpus_path` names; ValueError when there is none."""
        if self.corpus_path is None:
            raise ValueError(
                f"retrieval.retriever.method={self.method!r} needs retrieval.retriever.corpus_path (the corpus JSONL)"
            )
        return DocStore(self.corpus_path)


class IndexedSettings(CorpusSettings):
    """A corpus retriever with an index that `sr1 retrieval build-index` writes into a directory."""

    index_path: Path | None = Field(
        None,
        description="Index directory from `sr1 retrieval build-index` (dense: or a faiss .index file such as "
        "Search-R1's e5_Flat.index). None: index the corpus in memory at start.",
    )

    def open_store(self) -> DocStore:
        """The corpus, with its offsets cached beside a build-index directory when there is one."""
        store_dir = (
            self.index_path if self.index_path is not None and Path(self.index_path).is_dir() else None
        )
        if self.corpus_path is None or store_dir is None:
            return super().open_store()
        return DocStore.open_cached(self.corpus_path, store_dir)

    def write_index(self, store: DocStore, out: Path, show_progress: bool = True) -> None:
        """Index every passage of `store` into the directory `out`."""
        raise NotImplementedError(f"{type(self).__name__} does not say how to write its index")


# -- the family ---------------------------------------------------------------------------------------------------

# `method` -> member, in the order they were registered (the first is the default); filled by `retrieval.settings`
FAMILY = Family(RetrieverSettings, tag=TAG, section="retrieval.retriever", noun="retriever")
RETRIEVERS: dict[str, type[RetrieverSettings]] = FAMILY.members
method_of = FAMILY.tag_of
register_retriever = FAMILY.register
default_retriever = FAMILY.default
choose_retriever = FAMILY.choose

# the type of `retrieval.retriever`: any registered member, picked by `method`, dumped with all of its fields
RetrieverChoice = FAMILY.choice
