"""Prompt datasets: Search-R1's parquet layout and JSONL, read into `PromptRecord`s with globally unique group ids.

Parquet rows (Search-R1 `scripts/data_process/*.py`): `data_source`, `prompt` (one user message holding the
instruction and the question), `reward_model.ground_truth.target` (gold answers), `extra_info.{split,index}`.
JSONL lines may use the same fields, or FlashRAG's raw layout (`question`, `golden_answers`, optional `id`), in
which case the Search-R1 prompt is built here. A parquet row must hold `reward_model`; a `data_source` must be one of
`KNOWN_DATA_SOURCES` (a row without one reads as "unknown"). `tasks/search_r1/prepare.py` writes these files.

Group ids are `make_group_id(data_source, split, index, epoch)`: Search-R1 keyed GRPO groups by `index` alone, so NQ
and HotpotQA questions that shared an index were merged into one group.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from buffer.records import PromptRecord, make_group_id
from tasks.base import DataError
from tasks.search_r1.protocol import make_prompt_messages

log = logging.getLogger(__name__)

_QUESTION_MARK = "Question: "

# The QA datasets of Search-R1's train/test files (FlashRAG dataset names), in the order of its test file.
SEARCH_R1_SOURCES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
# The tiny world's synthetic questions (world/kb.py writes this data_source).
TINY_WORLD_SOURCE = "tinykb"
KNOWN_DATA_SOURCES = (*SEARCH_R1_SOURCES, TINY_WORLD_SOURCE)
UNKNOWN_SOURCE = "unknown"  # a row that names no data_source (e.g. a bare FlashRAG JSONL line)


def _plain(value: Any) -> Any:
    """numpy arrays / pyarrow scalars from parquet into plain Python lists and dicts."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _question_from_prompt(messages: list[dict[str, str]]) -> str:
    content = messages[-1]["content"] if messages else ""
    at = content.rfind(_QUESTION_MARK)
    return content[at + len(_QUESTION_MARK) :].strip() if at >= 0 else content.strip()


def row_to_record(
    row: dict[str, Any],
    *,
    position: int,
    split: str | None,
    epoch: int,
    where: str,
    data_sources: Collection[str] = KNOWN_DATA_SOURCES,
) -> PromptRecord:
    """One parquet/JSONL row (Search-R1 or FlashRAG layout) as a PromptRecord."""
    row = _plain(row)
    extra = row.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise DataError(f"{where}: 'extra_info' must be a mapping, got {type(extra).__name__}")
    if "reward_model" in row:
        reward_model = row["reward_model"] or {}
        try:
            target = reward_model["ground_truth"]["target"]
        except (KeyError, TypeError):
            raise DataError(
                f"{where}: expected reward_model.ground_truth.target (the gold answers)"
            ) from None
    elif "golden_answers" in row:
        target = row["golden_answers"]
    elif "answers" in row:
        target = row["answers"]
    else:
        raise DataError(
            f"{where}: no gold answers (expected reward_model.ground_truth.target, golden_answers or answers)"
        )
    golds = _gold_answers(target, where)

    prompt = row.get("prompt")
    if prompt is not None:
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        _check_messages(prompt, where)
        prompt = [{"role": m["role"], "content": m["content"]} for m in prompt]
        question = str(row.get("question") or _question_from_prompt(prompt))
    elif row.get("question"):
        question = str(row["question"])
        prompt = make_prompt_messages(question)
    else:
        raise DataError(f"{where}: neither 'prompt' nor 'question' is present")

    index = _index(row, extra, position, where)
    row_split = str(split or extra.get("split") or row.get("split") or "train")
    named_source = row.get("data_source")
    if named_source and named_source not in data_sources:
        raise DataError(
            f"{where}: unknown data_source {named_source!r}; expected one of {', '.join(data_sources)} "
            "(add your own with task.extra_data_sources)"
        )
    data_source = named_source or UNKNOWN_SOURCE
    return PromptRecord(
        group_id=make_group_id(data_source, row_split, index, epoch),
        question=question,
        prompt=prompt,
        ground_truth=golds,
        data_source=data_source,
        index=index,
        split=row_split,
    )


def _gold_answers(target: Any, where: str) -> list[str]:
    """The gold answers of a row: a non-empty string or a non-empty list of them (numbers read as text).

    A missing answer must not become the text "None", and an empty one would match every answer that normalises to
    nothing ("the", "a": exact match compares normalised text), so both are refused."""
    if target is None:
        raise DataError(f"{where}: the gold answers are missing (None)")
    if not isinstance(target, (str, list)):
        raise DataError(
            f"{where}: gold answers must be a string or a list of strings, got {type(target).__name__}"
        )
    answers = [target] if isinstance(target, str) else target
    if not answers:
        raise DataError(f"{where}: the list of gold answers is empty")
    golds = []
    for i, answer in enumerate(answers):
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            got = "None" if answer is None else type(answer).__name__
            raise DataError(f"{where}: gold answer {i} must be a string, got {got}")
        if not str(answer).strip():
            raise DataError(f"{where}: gold answer {i} is empty ({answer!r})")
        golds.append(str(answer))
    return golds


# an id that is a number, or a number behind a prefix without digits (FlashRAG's "train_123")
_ID_NUMBER = re.compile(r"(?:[A-Za-z]+[_\-:])?(\d+)")


def _index(row: dict[str, Any], extra: dict[str, Any], position: int, where: str) -> int:
    """The row's index (`extra_info.index`, else `index`, else `id`), else its position in the file."""
    given = [
        (name, holder[key])
        for name, holder, key in (
            ("extra_info.index", extra, "index"),
            ("index", row, "index"),
            ("id", row, "id"),
        )
        if holder.get(key) is not None
    ]
    if not given:
        return position
    field, value = given[0]
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    match = _ID_NUMBER.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise DataError(
            f"{where}: {field} {value!r} is not an index: expected a non-negative integer or a prefix and one number "
            "(train_123)"
        )
    return int(match.group(1))


def _check_messages(prompt: Any, where: str) -> None:
    """A prompt is a non-empty list of `{"role": str, "content": str}` messages (Search-R1: one user message)."""
    expected = "'prompt' must be a non-empty list of chat messages {'role': str, 'content': str}"
    if not isinstance(prompt, list) or not prompt:
        shape = type(prompt).__name__ if not isinstance(prompt, list) else "an empty list"
        raise DataError(f"{where}: {expected}, got {shape}")
    for i, message in enumerate(prompt):
        if not isinstance(message, dict):
            raise DataError(f"{where}: {expected}; message {i} is a {type(message).__name__}")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                got = "missing" if key not in message else type(message[key]).__name__
                raise DataError(f"{where}: {expected}; message {i} '{key}' is {got}")


def _rows(path: Path) -> Iterable[dict[str, Any]]:
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError) as err:
            raise DataError(f"{path}: not a readable parquet file ({type(err).__name__}: {err})") from None
        yield from table.to_pylist()
    elif path.suffix in (".jsonl", ".json"):
        with path.open() as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as err:
                    raise DataError(f"{path}:{line_no}: invalid JSON: {err}") from None
    else:
        raise DataError(f"{path}: unknown prompt file type {path.suffix!r}; expected .parquet or .jsonl")


def load_prompts(
    paths: Path | str | Iterable[Path | str],
    *,
    split: str | None = None,
    epoch: int = 0,
    data_sources: Collection[str] = KNOWN_DATA_SOURCES,
) -> list[PromptRecord]:
    """Every prompt of the given files, in file order; group ids unique across files, sources and epochs.

    A row whose (data_source, split, index) repeats one already read gets a `/dupK` suffix on its group id
    (logged), so no two prompts ever share a group.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    records: list[PromptRecord] = []
    seen: set[str] = set()
    duplicates = 0
    for path in map(Path, paths):
        if not path.is_file():
            raise DataError(f"prompt file {path} does not exist")
        for position, row in enumerate(_rows(path)):
            if not isinstance(row, dict):
                raise DataError(f"{path} row {position}: expected an object, got {type(row).__name__}")
            if path.suffix == ".parquet" and "reward_model" not in row:
                # FlashRAG's golden_answers may sit beside it, but a Search-R1 parquet's gold answers are these
                raise DataError(
                    f"{path} row {position}: no 'reward_model' (expected reward_model.ground_truth.target, "
                    "the gold answers of Search-R1's parquet layout)"
                )
            record = row_to_record(
                row,
                position=position,
                split=split,
                epoch=epoch,
                where=f"{path} row {position}",
                data_sources=data_sources,
            )
            if record.group_id in seen:
                duplicates += 1
                base, k = record.group_id, 1
                while f"{base}/dup{k}" in seen:
                    k += 1
                record.group_id = f"{base}/dup{k}"
            seen.add(record.group_id)
            records.append(record)
    if duplicates:
        log.warning(
            "%d prompt(s) repeated a (data_source, split, index) already read; given distinct ids", duplicates
        )
    return records
