"""The tiny world: determinism, Search-R1 file formats, and every test answer findable by its good query."""

from __future__ import annotations

import json

import pytest

from tasks.search_r1.protocol import format_documents, make_prompt_text
from world.kb import (
    ATTRIBUTE_BY_KEY,
    DATA_SOURCE,
    WorldSizes,
    build_kb,
    passage_value,
    write_corpus,
    write_questions,
)

SMALL = WorldSizes(num_people=120, num_first_names=24, num_last_names=40, num_cities=20, num_test=40)


@pytest.fixture(scope="module")
def kb():
    return build_kb(0, SMALL)


@pytest.fixture(scope="module")
def bm25(kb, tmp_path_factory):
    """The retrieval server's BM25 over the world's corpus, as the warm start searches it."""
    from retrieval.bm25 import BM25Retriever
    from retrieval.corpus import DocStore

    path = write_corpus(kb, tmp_path_factory.mktemp("corpus") / "corpus.jsonl")
    return BM25Retriever.build(DocStore(path), threads=1)


def test_same_seed_same_world(kb, tmp_path):
    again = build_kb(0, SMALL)
    a, b = write_corpus(kb, tmp_path / "a.jsonl"), write_corpus(again, tmp_path / "b.jsonl")
    assert a.read_bytes() == b.read_bytes()
    assert [(q.question, q.answer) for q in kb.test] == [(q.question, q.answer) for q in again.test]


def test_other_seed_other_facts(kb):
    other = build_kb(1, SMALL)
    assert {p.name for p in kb.people} != {p.name for p in other.people}
    assert [q.answer for q in kb.test] != [q.answer for q in other.test]


def test_sizes_and_splits(kb):
    assert len(kb.people) == SMALL.num_people
    assert len({p.name for p in kb.people}) == SMALL.num_people  # full names are unique
    assert len(kb.test) == SMALL.num_test
    assert len(kb.train) + len(kb.test) == SMALL.num_people * len(ATTRIBUTE_BY_KEY)
    facts = {(q.person, q.attribute) for q in kb.train}
    assert not facts & {(q.person, q.attribute) for q in kb.test}
    assert [q.index for q in kb.test] == list(range(len(kb.test)))
    # first names are shared, so a first-name query is ambiguous
    assert len({p.first for p in kb.people}) == SMALL.num_first_names


def test_corpus_is_search_r1_jsonl(kb, tmp_path):
    path = write_corpus(kb, tmp_path / "corpus.jsonl")
    lines = path.read_text().splitlines()
    assert len(lines) == len(kb.passages)
    ids = set()
    for line in lines:
        doc = json.loads(line)
        assert set(doc) == {"id", "contents"} and isinstance(doc["id"], str)
        title, _, text = doc["contents"].partition("\n")
        assert title.startswith('"') and title.endswith('"') and len(title) > 2 and text
        ids.add(doc["id"])
    assert len(ids) == len(lines)


def test_parquet_is_search_r1_layout(kb, tmp_path):
    import pyarrow.parquet as pq

    path = write_questions(kb.test, tmp_path / "test.parquet")
    table = pq.read_table(path)
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    rows = table.to_pylist()
    assert len(rows) == len(kb.test)
    row, q = rows[3], kb.test[3]
    assert row["data_source"] == DATA_SOURCE
    assert row["prompt"] == [{"role": "user", "content": make_prompt_text(q.question)}]
    assert row["prompt"][0]["content"].endswith(f"Question: {q.question}\n")
    assert row["ability"] == "fact-reasoning"
    assert row["reward_model"] == {"style": "rule", "ground_truth": {"target": [q.answer]}}
    assert row["extra_info"] == {"split": "test", "index": 3}


def test_good_query_finds_every_answer_first(kb, bm25):
    questions = kb.test + kb.train
    hits = bm25.search([kb.good_query(q) for q in questions], 3)
    for q, found in zip(questions, hits, strict=True):
        top = kb.passage(found.docs[0]["id"])
        assert (top.person, top.attribute) == (q.person, q.attribute), (q.question, kb.good_query(q))
        assert passage_value(top, kb) == q.answer
        assert q.answer in format_documents(found.docs).splitlines()[0]


def test_imperfect_query_is_often_wrong(kb, bm25):
    hits = bm25.search([kb.imperfect_query(q) for q in kb.test], 3)
    right = sum(
        passage_value(kb.passage(h.docs[0]["id"]), kb) == q.answer for q, h in zip(kb.test, hits, strict=True)
    ) / len(kb.test)
    assert right < 0.5  # room for RL: the first-name query usually lands on a namesake


def test_corpus_ids_name_the_passages(kb, bm25):
    for row in range(len(kb.passages)):
        doc = bm25.store.get(row)
        assert doc["contents"] == kb.passage(doc["id"]).contents
