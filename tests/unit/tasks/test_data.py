"""Prompt files: Search-R1 parquet, FlashRAG JSONL, unique group ids across datasets and epochs."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.search_r1.data import KNOWN_DATA_SOURCES, DataError, load_prompts
from tasks.search_r1.protocol import INSTRUCTION, make_prompt_text
from world.kb import DATA_SOURCE


def _search_r1_row(source: str, index: int, question: str, answers: list[str]) -> dict:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": make_prompt_text(question)}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
        "extra_info": {"split": "train", "index": index},
    }


def test_parquet_layout_and_unique_ids_across_sources(tmp_path):
    rows = [
        _search_r1_row("nq", 0, "who wrote hamlet", ["Shakespeare"]),
        _search_r1_row("hotpotqa", 0, "capital of france", ["Paris", "paris city"]),
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    records = load_prompts(path)
    assert [r.data_source for r in records] == ["nq", "hotpotqa"]
    # Search-R1 would have merged these two into one GRPO group (same index)
    assert len({r.group_id for r in records}) == 2
    assert records[0].question == "who wrote hamlet?"
    assert records[1].ground_truth == ["Paris", "paris city"]
    assert records[0].prompt[0]["content"].startswith(INSTRUCTION)
    assert records[0].split == "train" and records[0].index == 0


def test_flashrag_jsonl_builds_the_search_r1_prompt(tmp_path):
    path = tmp_path / "test.jsonl"
    lines = [
        {"id": "test_7", "question": "who founded alpha", "golden_answers": ["cedar"], "data_source": "nq"},
        {"question": "capital", "golden_answers": "Paris"},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    records = load_prompts(path, split="test")
    assert records[0].index == 7 and records[0].group_id.startswith("nq/test/7/")
    assert records[0].prompt == [{"role": "user", "content": make_prompt_text("who founded alpha")}]
    assert records[1].ground_truth == ["Paris"] and records[1].data_source == "unknown"


def test_duplicates_get_distinct_ids_and_epochs_differ(tmp_path):
    path = tmp_path / "d.jsonl"
    row = {"question": "q", "golden_answers": ["a"], "data_source": "nq", "id": 3}
    path.write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
    records = load_prompts(path)
    assert len({r.group_id for r in records}) == 2
    assert records[0].in_epoch(2).group_id != records[0].group_id
    assert records[1].in_epoch(2).group_id.endswith("/dup1")


def test_bad_rows_name_the_file_and_row(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl row 0: no gold answers"):
        load_prompts(path)
    with pytest.raises(DataError, match="does not exist"):
        load_prompts(tmp_path / "missing.parquet")
    (tmp_path / "x.csv").write_text("a")
    with pytest.raises(DataError, match="expected .parquet or .jsonl"):
        load_prompts(tmp_path / "x.csv")


def test_a_parquet_row_without_reward_model_names_the_file_and_row(tmp_path):
    # FlashRAG columns alone (golden_answers) are not a Search-R1 parquet: the gold answers must be in reward_model
    path = tmp_path / "flashrag.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"data_source": "nq", "question": "q", "golden_answers": ["a"]}]), path
    )
    with pytest.raises(DataError, match=r"flashrag.parquet row 0: no 'reward_model'"):
        load_prompts(path)
    rows = [_search_r1_row("nq", 0, "q", ["a"]), _search_r1_row("nq", 1, "r", ["b"])]
    rows[1]["reward_model"] = {"style": "rule", "ground_truth": None}
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(DataError, match=r"flashrag.parquet row 1: expected reward_model.ground_truth.target"):
        load_prompts(path)


def test_an_unknown_data_source_is_refused_naming_the_known_ones(tmp_path):
    path = tmp_path / "train.parquet"
    rows = [_search_r1_row("hotpotqa", 0, "q", ["a"]), _search_r1_row("squad", 1, "r", ["b"])]
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(
        DataError, match=r"train.parquet row 1: unknown data_source 'squad'; expected one of nq, "
    ):
        load_prompts(path)
    assert DATA_SOURCE in KNOWN_DATA_SOURCES  # the tiny world's questions stay readable
    # a user's own dataset is accepted once the task config names it
    from tasks.search_r1 import SearchR1Task
    from tasks.settings import SearchR1Config

    with pytest.raises(DataError, match="task.extra_data_sources"):
        SearchR1Task(SearchR1Config()).load_prompts(path)
    records = SearchR1Task(SearchR1Config(extra_data_sources=["squad"])).load_prompts(path)
    assert [r.data_source for r in records] == ["hotpotqa", "squad"]


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "got an empty list"),
        ({"role": "user", "content": "x"}, "got dict"),
        ([["user", "x"]], "message 0 is a list"),
        ([{"role": "user", "content": "x"}, {"content": "y"}], "message 1 'role' is missing"),
        ([{"role": "user", "content": 3}], "message 0 'content' is int"),
    ],
)
def test_a_prompt_that_is_not_a_list_of_messages_names_the_file_and_row(tmp_path, prompt, message):
    path = tmp_path / "p.jsonl"
    good = {
        "prompt": [{"role": "user", "content": "Question: q"}],
        "golden_answers": ["a"],
        "data_source": "nq",
    }
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "prompt": prompt}) + "\n")
    with pytest.raises(
        DataError, match=rf"p.jsonl row 1: 'prompt' must be a non-empty list of chat messages.*{message}"
    ):
        load_prompts(path)


@pytest.mark.parametrize(
    "target, expected",
    [
        (None, "row 1: the gold answers are missing"),
        ([], "row 1: the list of gold answers is empty"),
        ([""], "row 1: gold answer 0 is empty"),
        (["Paris", "  "], "row 1: gold answer 1 is empty"),
        (["Paris", None], "row 1: gold answer 1 must be a string, got None"),
    ],
)
def test_missing_or_empty_gold_answers_name_the_file_row_and_field(tmp_path, target, expected):
    rows = [_search_r1_row("nq", 0, "q0", ["a0"]), _search_r1_row("nq", 1, "q1", ["x"])]
    rows[1]["reward_model"]["ground_truth"]["target"] = target
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(DataError, match=f"train.parquet {expected}"):
        load_prompts(path)


@pytest.mark.parametrize("bad_id", ["q1_v2", "abc", "-3", "1.5", True])
def test_a_malformed_id_is_refused_not_read_as_its_digits(tmp_path, bad_id):
    path = tmp_path / "test.jsonl"
    lines = [
        {"id": "test_7", "question": "q", "golden_answers": ["a"]},
        {"id": bad_id, "question": "r", "golden_answers": ["b"]},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    with pytest.raises(DataError, match=r"test.jsonl row 1: id .* is not an index"):
        load_prompts(path)


@pytest.mark.parametrize("good_id, index", [("train_123", 123), ("17", 17), (17, 17), ("dev-4", 4)])
def test_numeric_and_prefixed_ids_are_read(tmp_path, good_id, index):
    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps({"id": good_id, "question": "q", "golden_answers": ["a"]}) + "\n")
    assert load_prompts(path)[0].index == index


def test_a_corrupt_parquet_is_a_data_error_naming_the_file(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([_search_r1_row("nq", 0, "q", ["a"])]), path)
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])  # cut in half
    with pytest.raises(DataError, match="train.parquet: not a readable parquet file"):
        load_prompts(path)


def test_an_empty_string_gold_answer_is_refused_in_jsonl(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps({"question": "q", "golden_answers": ""}) + "\n")
    with pytest.raises(DataError, match="test.jsonl row 0: gold answer 0 is empty"):
        load_prompts(path)
