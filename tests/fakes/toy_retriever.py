"""A toy retriever, to show that adding one is one module and one member of the retriever union: word overlap.

Its member, `ToySettings`, is what a retriever of the package would add to `retrieval/settings.py`'s `MEMBERS`;
from outside the package it joins the union with `register_retriever(ToySettings)`.
"""

from __future__ import annotations

import re
from typing import Literal

import numpy as np
from pydantic import Field

from retrieval.base import Hits, LocalRetriever, hits_from_rows
from retrieval.corpus import DocStore
from retrieval.union import CorpusSettings

_WORD = re.compile(r"\w+")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


class ToyRetriever(LocalRetriever):
    """Ranks passages by the number of words they share with the query (ties: corpus order)."""

    name = "toy"

    def __init__(self, store: DocStore, min_overlap: int):
        self.store = store
        self.min_overlap = min_overlap
        self._passages = [_words(text) for text in store.iter_contents()]

    def search(self, queries: list[str], topk: int) -> list[Hits]:
        ranked = []
        for query in queries:
            overlap = np.array([len(_words(query) & words) for words in self._passages])
            rows = np.argsort(-overlap, kind="stable")[:topk]
            rows = rows[overlap[rows] >= self.min_overlap]
            ranked.append((rows, overlap[rows].astype(np.float32)))
        return hits_from_rows(self.store, ranked)


class ToySettings(CorpusSettings):
    """The toy retriever: word overlap with every passage of the corpus."""

    method: Literal["toy"] = Field("toy", description="Which retriever (the union's tag).")
    min_overlap: int = Field(1, ge=1, description="Words a passage shares with the query to be a hit.")

    def build(self, show_progress: bool = False) -> ToyRetriever:
        return ToyRetriever(self.open_store(), self.min_overlap)
