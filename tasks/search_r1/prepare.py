"""`sr1 data prepare`: Search-R1's `train.parquet` and `test.parquet` from FlashRAG's QA datasets.

    sr1 data prepare --flashrag data/flashrag --out data/search_r1
    sr1 data prepare --flashrag data/flashrag --out data/nq_only --train nq --test nq,bamboogle
    sr1 data prepare --from-hub --out data/search_r1            # needs `pip install datasets` and network

`--flashrag DIR` is FlashRAG_datasets on disk, `DIR/<dataset>/<split>.jsonl` (one JSON object per line with `id`,
`question`, `golden_answers`, `metadata`); `--from-hub` reads the same rows with `datasets.load_dataset`. The files
hold the rows Search-R1's data scripts write, in the same order:

- train: the `train` split of each `--train` dataset (default nq, hotpotqa), concatenated in that order;
- test: each `--test` dataset's `test` split, else `dev`, else `train` (default: the 7 Search-R1 test sets);
- per row: the FlashRAG columns as they are, except `question`, stripped and ending with '?'; then `data_source`
  (the dataset name), `prompt` (one user message: the task's template with that question), `ability`,
  `reward_model` (`{"style": "rule", "ground_truth": {"target": golden_answers}}`) and `extra_info`
  (`{"split": "train" or "test", "index": the row's index within its dataset}`).

Every input row is checked first (errors name the file and line); both files are then written to temporary files in
`--out` and renamed only once both are complete, so a failure leaves any earlier output as it was.
`tasks/search_r1/data.py` reads the result (`data.train_files`, `data.test_files`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tasks.search_r1.data import SEARCH_R1_SOURCES
from tasks.search_r1.protocol import make_prompt_messages, normalize_question

HUB_REPO = "RUC-NLPIR/FlashRAG_datasets"
DEFAULT_TRAIN = ("nq", "hotpotqa")
DEFAULT_TEST = SEARCH_R1_SOURCES
TEST_SPLIT_PREFERENCE = ("test", "dev", "train")  # the first one a dataset has is its test set
ABILITY = "fact-reasoning"
# Search-R1 defines one template, "base", for any model; instruct models get their chat template at training time.
TEMPLATES: dict[str, Callable[[str], list[dict[str, str]]]] = {"base": make_prompt_messages}
ADDED_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")
HELP = "build Search-R1's train/test parquet files from FlashRAG's QA datasets (local files or the hub)"


class PrepareError(ValueError):
    """Bad input to `sr1 data prepare`; the message names the file, the line and what was expected."""


# -- reading FlashRAG rows ------------------------------------------------------------------------------------------


def check_flashrag_row(row: Any, where: str) -> dict[str, Any]:
    """`row` if it is a FlashRAG QA row: a non-empty `question` string and a non-empty list of answer strings."""
    if not isinstance(row, dict):
        raise PrepareError(f"{where}: expected a JSON object, got {type(row).__name__}")
    question = row.get("question")
    if "question" not in row:
        raise PrepareError(f"{where}: no 'question'")
    if not isinstance(question, str) or not question.strip():
        shown = "empty" if isinstance(question, str) else f"a {type(question).__name__}"
        raise PrepareError(f"{where}: 'question' must be a non-empty string, got {shown}")
    if "golden_answers" not in row:
        raise PrepareError(f"{where}: no 'golden_answers'")
    answers = row["golden_answers"]
    if not isinstance(answers, list) or not answers:
        shown = "an empty list" if isinstance(answers, list) else f"a {type(answers).__name__}"
        raise PrepareError(f"{where}: 'golden_answers' must be a non-empty list of strings, got {shown}")
    for i, answer in enumerate(answers):
        if not isinstance(answer, str):
            raise PrepareError(f"{where}: golden_answers[{i}] must be a string, got {type(answer).__name__}")
    return row


class FlashRAGSource(Protocol):
    """Where FlashRAG's rows come from: files on disk or the hub."""

    def splits(self, dataset: str) -> list[str]: ...  # the dataset's split names

    def describe(self, dataset: str) -> str: ...  # where the dataset is, for error messages

    def rows(self, dataset: str, split: str) -> list[dict[str, Any]]: ...  # its checked rows, in order


class LocalFlashRAG:
    """FlashRAG_datasets on disk: `root/<dataset>/<split>.jsonl`."""

    def __init__(self, root: Path, progress: Any = None):
        if not root.is_dir():
            raise PrepareError(
                f"--flashrag {root}: no such directory (expected {root}/<dataset>/<split>.jsonl)"
            )
        self.root = root
        self.progress = progress  # a rich Progress, or None

    def splits(self, dataset: str) -> list[str]:
        directory = self.root / dataset
        if not directory.is_dir():
            raise PrepareError(f"{directory}: no such dataset directory (expected {directory}/<split>.jsonl)")
        return sorted(p.stem for p in directory.glob("*.jsonl") if p.is_file())

    def describe(self, dataset: str) -> str:
        return str(self.root / dataset)

    def rows(self, dataset: str, split: str) -> list[dict[str, Any]]:
        path = self.root / dataset / f"{split}.jsonl"
        task = None
        if self.progress is not None:
            task = self.progress.add_task(f"{dataset}/{split}.jsonl", total=path.stat().st_size)
        rows: list[dict[str, Any]] = []
        done = 0
        # binary lines: their lengths advance the progress bar in bytes; json.loads decodes UTF-8 itself
        with path.open("rb") as f:
            for line_no, line in enumerate(f, start=1):
                done += len(line)
                if task is not None and line_no % 2048 == 0:
                    self.progress.update(task, completed=done)
                if not line.strip():
                    continue  # the datasets JSON reader skips blank lines too
                where = f"{path}:{line_no}"
                try:
                    row = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError) as err:
                    raise PrepareError(f"{where}: not JSON ({err})") from None
                rows.append(check_flashrag_row(row, where))
        if task is not None:
            self.progress.update(task, completed=done)
        if not rows:
            raise PrepareError(f"{path}: no rows")
        return rows


class HubFlashRAG:
    """FlashRAG_datasets from the Hugging Face hub, through `datasets.load_dataset` (as Search-R1's scripts read it)."""

    def __init__(self) -> None:
        try:
            import datasets
        except ImportError:
            raise PrepareError(
                "--from-hub needs the `datasets` library (pip install datasets); or download "
                f"{HUB_REPO} and pass --flashrag DIR"
            ) from None
        self._datasets = datasets
        self._loaded: dict[str, Any] = {}

    def _load(self, dataset: str) -> Any:
        if dataset not in self._loaded:
            try:
                self._loaded[dataset] = self._datasets.load_dataset(HUB_REPO, dataset)
            except Exception as err:  # network, authentication, a missing config: one clear line
                raise PrepareError(
                    f"could not load {HUB_REPO} {dataset!r}: {type(err).__name__}: {err}"
                ) from None
        return self._loaded[dataset]

    def splits(self, dataset: str) -> list[str]:
        return sorted(self._load(dataset).keys())

    def describe(self, dataset: str) -> str:
        return f"{HUB_REPO} {dataset}"

    def rows(self, dataset: str, split: str) -> list[dict[str, Any]]:
        table = self._load(dataset)[split]
        rows = [
            check_flashrag_row(row, f"{HUB_REPO} {dataset}/{split} row {i}") for i, row in enumerate(table)
        ]
        if not rows:
            raise PrepareError(f"{HUB_REPO} {dataset}/{split}: no rows")
        return rows


# -- Search-R1 rows -------------------------------------------------------------------------------------------------


def search_r1_row(
    flashrag_row: dict[str, Any], *, data_source: str, split: str, index: int, template: str = "base"
) -> dict[str, Any]:
    """One output row: the FlashRAG columns (question cleaned) followed by Search-R1's five columns."""
    question = normalize_question(flashrag_row["question"])
    return {
        **flashrag_row,
        "question": question,
        "data_source": data_source,
        "prompt": TEMPLATES[template](question),
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": {"target": list(flashrag_row["golden_answers"])}},
        "extra_info": {"split": split, "index": index},
    }


@dataclass
class Part:
    """One dataset's rows in one output file."""

    data_source: str
    flashrag_split: str
    rows: list[dict[str, Any]] = field(default_factory=list)


def parse_names(text: str, option: str) -> list[str]:
    """`nq,hotpotqa` as a list of known dataset names; unknown, repeated or no names are errors."""
    names = [name.strip() for name in text.split(",")]
    if not text.strip() or any(not name for name in names):
        raise PrepareError(f"{option} {text!r}: expected comma-separated dataset names, e.g. nq,hotpotqa")
    for name in names:
        if name not in SEARCH_R1_SOURCES:
            raise PrepareError(f"{option}: unknown dataset {name!r}; known: {', '.join(SEARCH_R1_SOURCES)}")
        if names.count(name) > 1:
            raise PrepareError(f"{option} names {name!r} more than once")
    return names


def build_parts(source: FlashRAGSource, datasets: list[str], *, file_split: str, template: str) -> list[Part]:
    """The rows of one output file: per dataset, its split for `file_split` ("train" or "test"), in order."""
    parts = []
    for dataset in datasets:
        available = source.splits(dataset)
        wanted = ("train",) if file_split == "train" else TEST_SPLIT_PREFERENCE
        chosen = next((s for s in wanted if s in available), None)
        if chosen is None:
            found = ", ".join(available) or "no <split>.jsonl files"
            raise PrepareError(
                f"{source.describe(dataset)}: no usable split for {file_split} "
                f"(expected {' or '.join(wanted)}; found {found})"
            )
        part = Part(dataset, chosen)
        for index, row in enumerate(source.rows(dataset, chosen)):
            part.rows.append(
                search_r1_row(row, data_source=dataset, split=file_split, index=index, template=template)
            )
        parts.append(part)
    return parts


# -- writing --------------------------------------------------------------------------------------------------------


def _parquet_can_store(arrow_type: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_struct(arrow_type):
        return arrow_type.num_fields > 0 and all(_parquet_can_store(f.type) for f in arrow_type)
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return _parquet_can_store(arrow_type.value_type)
    return True


def _added_column_types() -> dict[str, Any]:
    import pyarrow as pa

    return {
        "data_source": pa.string(),
        "prompt": pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])),
        "ability": pa.string(),
        "reward_model": pa.struct(
            [("style", pa.string()), ("ground_truth", pa.struct([("target", pa.list_(pa.string()))]))]
        ),
        "extra_info": pa.struct([("split", pa.string()), ("index", pa.int64())]),
    }


def to_table(rows: list[dict[str, Any]]) -> tuple[Any, list[str]]:
    """The rows as an Arrow table (FlashRAG columns in order of first appearance, then Search-R1's five) and the
    FlashRAG columns written as JSON text because their values share no Arrow type Parquet can store (e.g.
    `metadata` that is `{}` in every row, or that differs in shape between datasets)."""
    import pyarrow as pa

    flashrag_columns: dict[str, None] = {}
    for row in rows:
        flashrag_columns.update((key, None) for key in row if key not in ADDED_COLUMNS)
    arrays, as_json = {}, []
    for column in flashrag_columns:
        values = [row.get(column) for row in rows]
        try:
            array = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            array = None
        if array is None or not _parquet_can_store(array.type):
            as_json.append(column)
            array = pa.array(
                [None if v is None else json.dumps(v, ensure_ascii=False) for v in values], pa.string()
            )
        arrays[column] = array
    for column, arrow_type in _added_column_types().items():
        arrays[column] = pa.array([row[column] for row in rows], arrow_type)
    return pa.table(arrays), as_json


def write_all_or_nothing(tables: dict[Path, Any]) -> None:
    """Write every table to a temporary file beside its destination, then rename them all; on any error the
    temporary files are removed and the destinations keep what they held."""
    import pyarrow.parquet as pq

    temporaries: list[tuple[Path, Path]] = []
    try:
        for destination, table in tables.items():
            fd, name = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.", suffix=".tmp")
            os.close(fd)
            temporaries.append((Path(name), destination))
            pq.write_table(table, name)
            with open(name, "rb") as written:
                os.fsync(written.fileno())
        for temporary, destination in temporaries:
            os.replace(temporary, destination)
    finally:
        for temporary, _ in temporaries:
            temporary.unlink(missing_ok=True)


# -- the command ----------------------------------------------------------------------------------------------------


@dataclass
class Prepared:
    """What `prepare` wrote: per file, its parts (data source, FlashRAG split, rows) and its JSON-text columns."""

    files: dict[Path, list[Part]]
    json_columns: dict[Path, list[str]]


def prepare(
    source: FlashRAGSource, out: Path, *, train: list[str], test: list[str], template: str = "base"
) -> Prepared:
    """Read and check every input row, then write `out/train.parquet` and `out/test.parquet` together."""
    if template not in TEMPLATES:
        raise PrepareError(f"--template {template!r}: unknown; known: {', '.join(TEMPLATES)}")
    files = {
        out / "train.parquet": build_parts(source, train, file_split="train", template=template),
        out / "test.parquet": build_parts(source, test, file_split="test", template=template),
    }
    tables, json_columns = {}, {}
    for path, parts in files.items():
        tables[path], json_columns[path] = to_table([row for part in parts for row in part.rows])
    out.mkdir(parents=True, exist_ok=True)
    write_all_or_nothing(tables)
    return Prepared(files, json_columns)


def summary_table(prepared: Prepared) -> Any:
    from rich.table import Table

    out = next(iter(prepared.files)).parent
    table = Table(title=f"sr1 data prepare → {out}")
    table.add_column("file")
    table.add_column("data_source")
    table.add_column("FlashRAG split")
    table.add_column("rows", justify="right")
    for path, parts in prepared.files.items():
        for part in parts:
            table.add_row(path.name, part.data_source, part.flashrag_split, f"{len(part.rows):,}")
        total = sum(len(part.rows) for part in parts)
        table.add_row(path.name, "[bold]all[/bold]", "", f"[bold]{total:,}[/bold]", end_section=True)
    return table


@contextmanager
def _reading_progress(console: Any) -> Iterator[Any]:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
        yield progress


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sr1 data", description="Datasets for the Search-R1 task.")
    commands = parser.add_subparsers(dest="command", required=True)
    cmd = commands.add_parser("prepare", help=HELP, description=__doc__.split("\n\n")[0])
    origin = cmd.add_mutually_exclusive_group(required=True)
    origin.add_argument(
        "--flashrag", type=Path, metavar="DIR", help="FlashRAG_datasets on disk: DIR/<dataset>/<split>.jsonl."
    )
    origin.add_argument(
        "--from-hub",
        action="store_true",
        help=f"Read {HUB_REPO} with the `datasets` library (must be installed; needs network).",
    )
    cmd.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="Where train.parquet and test.parquet go."
    )
    cmd.add_argument(
        "--train",
        default=",".join(DEFAULT_TRAIN),
        metavar="NAMES",
        help="Datasets whose train split makes train.parquet, in order (default: %(default)s).",
    )
    cmd.add_argument(
        "--test",
        default=",".join(DEFAULT_TEST),
        metavar="NAMES",
        help="Datasets whose test (else dev, else train) split makes test.parquet, in order (default: %(default)s).",
    )
    cmd.add_argument("--template", default="base", choices=list(TEMPLATES), help="The prompt template.")
    return parser


def main(argv: list[str] | None = None) -> int:
    """`sr1 data prepare ...`; bad input is one line on stderr and exit code 2."""
    from rich.console import Console

    args = _parser().parse_args(argv)
    console = Console()
    try:
        train = parse_names(args.train, "--train")
        test = parse_names(args.test, "--test")
        with _reading_progress(console) as progress:
            source = HubFlashRAG() if args.from_hub else LocalFlashRAG(args.flashrag, progress)
            prepared = prepare(source, args.out, train=train, test=test, template=args.template)
    except (PrepareError, OSError) as err:
        print(f"sr1 data prepare: {err}", file=sys.stderr)
        return 2
    console.print(summary_table(prepared))
    for path, columns in prepared.json_columns.items():
        if columns:
            note = f"{path.name}: {', '.join(columns)} written as JSON text (no single Arrow type fits every row)"
            console.print(note, soft_wrap=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
