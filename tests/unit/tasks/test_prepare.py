"""`sr1 data prepare`: FlashRAG-shaped JSONL in, Search-R1's train/test parquet out (rows, order, errors, atomicity)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tasks.search_r1.data import load_prompts
from tasks.search_r1.prepare import main
from tasks.search_r1.protocol import INSTRUCTION

FLASHRAG_COLUMNS = ["id", "question", "golden_answers", "metadata"]
ALL_COLUMNS = [*FLASHRAG_COLUMNS, "data_source", "prompt", "ability", "reward_model", "extra_info"]


def _line(id_: str, question: str, answers: list[str], **metadata: str) -> dict:
    return {"id": id_, "question": question, "golden_answers": answers, "metadata": {"note": "", **metadata}}


# dataset -> split -> FlashRAG rows; popqa has only a test split, hotpotqa/musique no test, 2wikimultihopqa only train
FLASHRAG = {
    "nq": {
        "train": [
            _line("train_0", "  who wrote hamlet ", ["Shakespeare", "William Shakespeare"]),
            _line("train_1", "capital of france?", ["Paris"]),
            _line("train_2", "\twhere is Zürich", ["Switzerland"], note="non-ascii"),
        ],
        "dev": [_line("dev_0", "never used", ["x"])],
        "test": [
            _line("test_0", "when did it rain ?  ", ["1990"]),
            _line("test_1", "how tall is it", ["2 m"]),
        ],
    },
    "hotpotqa": {
        "train": [_line("train_0", "which band is older", ["A"], note="comparison")],
        "dev": [_line("dev_0", "who directed X?", ["Y"]), _line("dev_1", " who wrote Z", ["W"])],
    },
    "popqa": {"test": [_line("test_0", "What is Ada's occupation", ["painter", "artist"])]},
    "musique": {"train": [_line("train_0", "never used", ["x"])], "dev": [_line("dev_0", "q one", ["a1"])]},
    "2wikimultihopqa": {"train": [_line("train_0", "q two?", ["a2"])]},
}
TEST_SOURCES = "nq,popqa,hotpotqa,musique,2wikimultihopqa"


def _write_flashrag(root: Path, data: dict) -> Path:
    for dataset, splits in data.items():
        (root / dataset).mkdir(parents=True, exist_ok=True)
        for split, rows in splits.items():
            lines = [json.dumps(row, ensure_ascii=False) for row in rows]
            # a blank line between rows is skipped, as the datasets JSON reader skips it
            (root / dataset / f"{split}.jsonl").write_text("\n\n".join(lines) + "\n")
    return root


@pytest.fixture
def flashrag(tmp_path) -> Path:
    return _write_flashrag(tmp_path / "flashrag", FLASHRAG)


def _run(flashrag: Path, out: Path, *extra: str) -> int:
    return main(["prepare", "--flashrag", str(flashrag), "--out", str(out), "--test", TEST_SOURCES, *extra])


def _expected(raw: dict, question: str, source: str, split: str, index: int) -> dict:
    """A row as Search-R1's qa_search_*_merge.py writes it, with its cleaned question spelled out by hand."""
    return {
        "id": raw["id"],
        "question": question,
        "golden_answers": raw["golden_answers"],
        "metadata": raw["metadata"],
        "data_source": source,
        "prompt": [{"role": "user", "content": INSTRUCTION + question + "\n"}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": raw["golden_answers"]}},
        "extra_info": {"split": split, "index": index},
    }


def test_train_and_test_files_hold_search_r1_rows_in_order(flashrag, tmp_path, capsys):
    out = tmp_path / "out"
    assert _run(flashrag, out) == 0
    nq, hotpot = FLASHRAG["nq"], FLASHRAG["hotpotqa"]
    train = pq.read_table(out / "train.parquet")
    assert train.column_names == ALL_COLUMNS
    assert train.to_pylist() == [
        _expected(nq["train"][0], "who wrote hamlet?", "nq", "train", 0),
        _expected(nq["train"][1], "capital of france?", "nq", "train", 1),
        _expected(nq["train"][2], "where is Zürich?", "nq", "train", 2),
        _expected(hotpot["train"][0], "which band is older?", "hotpotqa", "train", 0),
    ]
    test = pq.read_table(out / "test.parquet")
    assert test.column_names == ALL_COLUMNS
    # each dataset's test split, else dev, else train; every row marked split "test", indexed within its dataset
    assert test.to_pylist() == [
        _expected(nq["test"][0], "when did it rain ?", "nq", "test", 0),
        _expected(nq["test"][1], "how tall is it?", "nq", "test", 1),
        _expected(FLASHRAG["popqa"]["test"][0], "What is Ada's occupation?", "popqa", "test", 0),
        _expected(hotpot["dev"][0], "who directed X?", "hotpotqa", "test", 0),
        _expected(hotpot["dev"][1], "who wrote Z?", "hotpotqa", "test", 1),
        _expected(FLASHRAG["musique"]["dev"][0], "q one?", "musique", "test", 0),
        _expected(FLASHRAG["2wikimultihopqa"]["train"][0], "q two?", "2wikimultihopqa", "test", 0),
    ]
    summary = capsys.readouterr().out
    for cells in (("train.parquet", "nq", "train", "3"), ("test.parquet", "hotpotqa", "dev", "2")):
        assert any(all(cell in line.split() for cell in cells) for line in summary.splitlines()), summary
    assert not [p.name for p in out.iterdir() if p.name not in ("train.parquet", "test.parquet")]


def test_train_order_follows_the_option(flashrag, tmp_path):
    out = tmp_path / "out"
    assert _run(flashrag, out, "--train", "hotpotqa,nq") == 0
    rows = pq.read_table(out / "train.parquet").to_pylist()
    assert [(r["data_source"], r["extra_info"]["index"]) for r in rows] == [
        ("hotpotqa", 0),
        ("nq", 0),
        ("nq", 1),
        ("nq", 2),
    ]


def test_the_train_file_loads_through_the_task_reader(flashrag, tmp_path):
    out = tmp_path / "out"
    assert _run(flashrag, out) == 0
    records = load_prompts(out / "train.parquet", split="train")
    assert [(r.data_source, r.index, r.question) for r in records] == [
        ("nq", 0, "who wrote hamlet?"),
        ("nq", 1, "capital of france?"),
        ("nq", 2, "where is Zürich?"),
        ("hotpotqa", 0, "which band is older?"),
    ]
    assert [r.ground_truth for r in records] == [
        ["Shakespeare", "William Shakespeare"],
        ["Paris"],
        ["Switzerland"],
        ["A"],
    ]
    assert records[0].prompt == [{"role": "user", "content": INSTRUCTION + "who wrote hamlet?\n"}]
    assert len({r.group_id for r in records}) == 4  # nq 0 and hotpotqa 0 stay apart
    test_records = load_prompts(out / "test.parquet", split="test")
    assert [r.data_source for r in test_records][-2:] == ["musique", "2wikimultihopqa"]


def test_metadata_that_parquet_cannot_store_natively_is_json_text(tmp_path, capsys):
    data = {
        "nq": {"train": [{"id": "a", "question": "q", "golden_answers": ["x"], "metadata": {}}]},
        "hotpotqa": {
            "train": [{"id": "b", "question": "r", "golden_answers": ["y"], "metadata": {"level": 3}}],
            "dev": [{"id": "c", "question": "s", "golden_answers": ["z"], "metadata": {"level": "hard"}}],
        },
    }
    root, out = _write_flashrag(tmp_path / "fr", data), tmp_path / "out"
    assert main(["prepare", "--flashrag", str(root), "--out", str(out), "--test", "nq"]) == 0
    # train: {} and {"level": 3} share one struct type
    assert [r["metadata"] for r in pq.read_table(out / "train.parquet").to_pylist()] == [
        {"level": None},
        {"level": 3},
    ]
    # test: nq's train row alone, whose {} is a struct without fields, which parquet cannot store
    assert [r["metadata"] for r in pq.read_table(out / "test.parquet").to_pylist()] == ["{}"]
    assert "test.parquet: metadata written as JSON text" in capsys.readouterr().out
    data["nq"]["train"][0]["metadata"] = {
        "level": "easy"
    }  # now no single type fits `level` in the train file
    root = _write_flashrag(tmp_path / "fr2", data)
    assert main(["prepare", "--flashrag", str(root), "--out", str(out), "--test", "hotpotqa"]) == 0
    train = pq.read_table(out / "train.parquet").to_pylist()
    assert [json.loads(r["metadata"]) for r in train] == [{"level": "easy"}, {"level": 3}]
    assert [r["metadata"] for r in pq.read_table(out / "test.parquet").to_pylist()] == [{"level": "hard"}]
    assert "train.parquet: metadata written as JSON text" in capsys.readouterr().out


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not JSON"),
        ('["a list"]', "expected a JSON object, got list"),
        ('{"id": "x", "golden_answers": ["a"]}', "no 'question'"),
        (
            '{"id": "x", "question": "   ", "golden_answers": ["a"]}',
            "'question' must be a non-empty string, got empty",
        ),
        ('{"id": "x", "question": "q"}', "no 'golden_answers'"),
        (
            '{"question": "q", "golden_answers": []}',
            "'golden_answers' must be a non-empty list of strings, got an empty",
        ),
        ('{"question": "q", "golden_answers": "Paris"}', "must be a non-empty list of strings, got a str"),
        ('{"question": "q", "golden_answers": ["a", 3]}', "golden_answers[1] must be a string, got int"),
    ],
)
def test_a_bad_flashrag_line_is_named_by_file_and_line(flashrag, tmp_path, capsys, line, message):
    path = flashrag / "popqa" / "test.jsonl"
    good = json.dumps(_line("test_9", "fine", ["ok"]))
    path.write_text(f"{good}\n\n{line}\n")
    out = tmp_path / "out"
    assert _run(flashrag, out) == 2
    err = _error(capsys)
    assert f"{path}:3: " in err and message in err
    assert not out.exists()  # all input is checked before anything is written


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--train", "nq,squad"], "--train: unknown dataset 'squad'; known: nq, triviaqa, popqa, hotpotqa, "),
        (["--test", "nq,,popqa"], "expected comma-separated dataset names"),
        (["--test", "nq,nq"], "--test names 'nq' more than once"),
        (["--test", "nq,bamboogle"], "bamboogle: no such dataset directory"),
    ],
)
def test_bad_dataset_names_and_missing_directories(flashrag, tmp_path, capsys, args, message):
    assert _run(flashrag, tmp_path / "out", *args) == 2
    assert message in _error(capsys)
    assert not (tmp_path / "out").exists()


def test_a_dataset_without_a_usable_split(flashrag, tmp_path, capsys):
    (flashrag / "hotpotqa" / "train.jsonl").unlink()
    assert _run(flashrag, tmp_path / "out") == 2
    assert "hotpotqa: no usable split for train (expected train; found dev)" in _error(capsys)
    (flashrag / "bamboogle").mkdir()
    (flashrag / "bamboogle" / "README.md").write_text("no splits here")
    assert _run(flashrag, tmp_path / "out", "--train", "nq", "--test", "bamboogle") == 2
    err = _error(capsys)
    assert (
        "bamboogle: no usable split for test (expected test or dev or train; found no <split>.jsonl files)"
        in err
    )
    (flashrag / "popqa" / "test.jsonl").write_text("\n")
    assert _run(flashrag, tmp_path / "out", "--train", "nq", "--test", "popqa") == 2
    assert f"{flashrag / 'popqa' / 'test.jsonl'}: no rows" in _error(capsys)
    assert main(["prepare", "--flashrag", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")]) == 2
    assert "nowhere: no such directory" in _error(capsys)


def test_a_failure_leaves_earlier_output_untouched(flashrag, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.parquet").write_bytes(b"old train")
    (out / "test.parquet").write_bytes(b"old test")
    # bad input for the test file, which is read after the train file
    (flashrag / "musique" / "dev.jsonl").write_text('{"question": "q", "golden_answers": []}\n')
    assert _run(flashrag, out) == 2
    _error(capsys)
    assert sorted(p.name for p in out.iterdir()) == ["test.parquet", "train.parquet"]
    assert (out / "train.parquet").read_bytes() == b"old train"
    # a write that fails after the train file is complete: neither file is replaced, no temporary file is left
    _write_flashrag(flashrag, {"musique": FLASHRAG["musique"]})
    real_write = pq.write_table
    calls = []

    def failing_second_write(table, where, **kwargs):
        calls.append(where)
        if len(calls) == 2:
            raise OSError(f"{where}: no space left on device")
        real_write(table, where, **kwargs)

    monkeypatch.setattr(pq, "write_table", failing_second_write)
    assert _run(flashrag, out) == 2
    assert "no space left on device" in _error(capsys) and len(calls) == 2
    assert sorted(p.name for p in out.iterdir()) == ["test.parquet", "train.parquet"]
    assert (out / "train.parquet").read_bytes() == b"old train"
    assert (out / "test.parquet").read_bytes() == b"old test"


class _FakeHubDatasets:
    """The part of the `datasets` API `--from-hub` uses: load_dataset(repo, name) -> {split: rows}."""

    def __init__(self, data: dict):
        self.data, self.calls = data, []

    def load_dataset(self, repo: str, name: str) -> dict:
        self.calls.append((repo, name))
        if name not in self.data:
            raise ValueError(f"BuilderConfig '{name}' not found")
        return self.data[name]


def test_from_hub_reads_the_same_rows(flashrag, tmp_path, monkeypatch, capsys):
    assert _run(flashrag, tmp_path / "local") == 0
    fake = _FakeHubDatasets(FLASHRAG)
    monkeypatch.setitem(sys.modules, "datasets", fake)
    args = ["prepare", "--from-hub", "--out", str(tmp_path / "hub"), "--test", TEST_SOURCES]
    assert main(args) == 0
    assert ("RUC-NLPIR/FlashRAG_datasets", "nq") in fake.calls
    for name in ("train.parquet", "test.parquet"):
        assert pq.read_table(tmp_path / "hub" / name).equals(pq.read_table(tmp_path / "local" / name))
    capsys.readouterr()
    assert main([*args, "--train", "nq,triviaqa"]) == 2
    assert "could not load RUC-NLPIR/FlashRAG_datasets 'triviaqa': ValueError" in _error(capsys)


def test_from_hub_without_the_datasets_library(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
    assert main(["prepare", "--from-hub", "--out", str(tmp_path / "out")]) == 2
    assert "--from-hub needs the `datasets` library" in _error(capsys)
