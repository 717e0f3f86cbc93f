"""The tiny world: determinism, Search-R1 file formats, and every test answer findable by its good query."""

from __future__ import annotations

import json

import pytest

from sr1.world import (
    ATTRIBUTE_BY_KEY,
    DATA_SOURCE,
    PassageSearch,
    WorldSizes,
    build_kb,
    format_observation,
    passage_value,
    search_r1_prompt,
    write_corpus,
    write_questions,
)

SMALL = WorldSizes(num_people=120, num_first_names=24, num_last_names=40, num_cities=20, num_test=40)


@pytest.fixture(scope="module")
def kb():
    return build_kb(0, SMALL)


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
    assert row["prompt"] == [{"role": "user", "content": search_r1_prompt(q.question)}]
    assert row["prompt"][0]["content"].endswith(f"Question: {q.question}\n")
    assert row["ability"] == "fact-reasoning"
    assert row["reward_model"] == {"style": "rule", "ground_truth": {"target": [q.answer]}}
    assert row["extra_info"] == {"split": "test", "index": 3}


def test_good_query_finds_every_answer_first(kb):
    search = PassageSearch(kb.passages)
    questions = kb.test + kb.train
    hits = search.search([kb.good_query(q) for q in questions], topk=3)
    for q, passages in zip(questions, hits, strict=True):
        top = passages[0]
        assert (top.person, top.attribute) == (q.person, q.attribute), (q.question, kb.good_query(q))
        assert passage_value(top, kb) == q.answer
        assert q.answer in format_observation(passages).splitlines()[0]


def test_imperfect_query_is_often_wrong(kb):
    search = PassageSearch(kb.passages)
    hits = search.search([kb.imperfect_query(q) for q in kb.test], topk=3)
    right = sum(passage_value(p[0], kb) == q.answer for q, p in zip(kb.test, hits, strict=True)) / len(
        kb.test
    )
    assert right < 0.5  # room for RL: the first-name query usually lands on a namesake


def test_observation_format(kb):
    passages = kb.passages[:2]
    lines = format_observation(passages).split("\n")
    assert lines[0] == f'Doc 1(Title: "{passages[0].title}") {passages[0].text}'
    assert lines[1].startswith(f'Doc 2(Title: "{passages[1].title}") ')
    assert format_observation([]) == "No documents found for this query."
