import json

import pytest

from retrieval.corpus import CorpusError, DocStore, join_contents, split_contents, write_corpus_jsonl


def test_split_contents_removes_title_quotes_and_keeps_multiline_text():
    assert split_contents('"Paris"\nParis is big.\nSecond line.') == ("Paris", "Paris is big.\nSecond line.")
    assert split_contents("no title line") == ("", "no title line")
    assert split_contents(join_contents('A "B"', "x")) == ('A "B"', "x")


def test_write_and_read_roundtrip(tmp_path):
    path = tmp_path / "c.jsonl"
    n = write_corpus_jsonl(
        path, [{"id": 7, "title": "T", "text": "héllo"}, {"id": "x", "contents": '"U"\nv'}]
    )
    assert n == 2
    with DocStore(path) as store:
        assert len(store) == 2
        assert store.get(0) == {"id": "7", "contents": '"T"\nhéllo'}
        assert store.get_many([1, 0])[0] == {"id": "x", "contents": '"U"\nv'}
        with pytest.raises(IndexError, match="out of range"):
            store.get(2)


def test_blank_lines_are_skipped_and_rows_count_passages(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(
        json.dumps({"id": 0, "contents": "a"}) + "\n\n" + json.dumps({"id": 1, "contents": "b"}) + "\n"
    )
    with DocStore(path) as store:
        assert [d["id"] for d in store.get_many(range(len(store)))] == ["0", "1"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"contents": "x"}', "missing 'id'"),
        ('{"id": 3}', "missing or non-string 'contents'"),
        ('{"id": 3, "contents": 5}', "missing or non-string 'contents'"),
    ],
)
def test_bad_line_names_file_and_line_number(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": 0, "contents": "ok"}\n{"id": 1, "contents": "ok"}\n' + line + "\n")
    with pytest.raises(CorpusError, match=rf"bad.jsonl:3: {message}"):
        DocStore(path)


def test_offsets_cache_is_reused_and_invalidated(tmp_path):
    path = tmp_path / "c.jsonl"
    write_corpus_jsonl(path, [{"id": i, "contents": f"doc {i}"} for i in range(5)])
    cache = tmp_path / "idx"
    DocStore.open_cached(path, cache).close()
    assert (cache / "doc_offsets.npy").exists()
    with DocStore.open_cached(path, cache) as store:
        assert store.get(4)["contents"] == "doc 4"
    write_corpus_jsonl(path, [{"id": i, "contents": f"document {i}"} for i in range(6)])
    with DocStore.open_cached(path, cache) as store:
        assert len(store) == 6 and store.get(5)["contents"] == "document 5"


def test_get_many_decodes_a_batch_like_get_and_names_a_bad_row(tmp_path):
    path = tmp_path / "c.jsonl"
    good = [json.dumps({"id": i, "contents": f'"T{i}"\ntext {i}'}) for i in range(4)]
    # a line holding two records would shift every later passage if decoded as part of one JSON array
    two_values = json.dumps({"id": 8, "contents": "a"}) + ", " + json.dumps({"id": 9, "contents": "b"})
    path.write_text("\n".join([*good, two_values, '{"id": 5}']) + "\n")
    with DocStore(path, validate=False) as store:
        assert store.get_many([3, 0, 3, 2]) == [store.get(i) for i in (3, 0, 3, 2)]
        assert store.get_many([]) == []
        with pytest.raises(CorpusError, match=r"c.jsonl \(passage row 4\): not valid JSON"):
            store.get_many([1, 4])
        with pytest.raises(CorpusError, match=r"c.jsonl \(passage row 5\): missing or non-string 'contents'"):
            store.get_many([0, 5])
        with pytest.raises(IndexError, match="row 6 out of range"):
            store.get_many([0, 6])
