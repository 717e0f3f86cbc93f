"""Corpus files and the doc store.

A corpus is JSONL, one passage per line, in Search-R1's wiki-18 format: `{"id": "12", "contents": "\"Title\"\\ntext"}`
(lines with `title` and `text` instead of `contents` are accepted and joined the same way). The doc store keeps
only a numpy array of byte offsets and reads passages through an mmap of the file, so 21M passages cost 168 MB of
offsets rather than tens of GB of Python strings. A malformed line is a `CorpusError` naming the file and line.
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np


class CorpusError(ValueError):
    """A corpus line that is not a passage record; the message names the file and the 1-based line."""


def split_contents(contents: str) -> tuple[str, str]:
    """Split Search-R1 `contents` into (title, text): the title is the first line with its double quotes removed."""
    first, sep, rest = contents.partition("\n")
    if not sep:
        return "", contents
    title = first.strip()
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1]
    return title, rest


def join_contents(title: str, text: str) -> str:
    """The inverse of `split_contents`: `"Title"\\ntext`."""
    return f'"{title}"\n{text}'


def parse_record(line: bytes | str, where: str) -> dict[str, str]:
    """Decode one corpus line into {"id", "contents"} or raise `CorpusError` starting with `where` (`file:line`)."""
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorpusError(f"{where}: not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc})") from None
    return record_from_json(obj, where)


def record_from_json(obj: Any, where: str) -> dict[str, str]:
    """Validate one decoded corpus line into {"id", "contents"} or raise `CorpusError` naming the line."""
    if not isinstance(obj, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "id" not in obj:
        raise CorpusError(f"{where}: missing 'id' (expected {{'id': ..., 'contents': ...}})")
    doc_id = obj["id"]
    if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
        raise CorpusError(f"{where}: 'id' must be a string or integer, got {type(doc_id).__name__}")
    contents = obj.get("contents")
    if contents is None and "text" in obj:
        title, text = obj.get("title", ""), obj["text"]
        if not isinstance(title, str) or not isinstance(text, str):
            raise CorpusError(f"{where}: 'title' and 'text' must be strings")
        contents = join_contents(title, text)
    if not isinstance(contents, str):
        raise CorpusError(
            f"{where}: missing or non-string 'contents' (expected {{'id': ..., 'contents': '\"Title\"\\ntext'}})"
        )
    return {"id": str(doc_id), "contents": contents}


def write_corpus_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> int:
    """Write records ({"id", "contents"} or {"id", "title", "text"}) as corpus JSONL; returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for i, rec in enumerate(records):
            if "contents" in rec:
                contents = rec["contents"]
            else:
                contents = join_contents(rec.get("title", ""), rec["text"])
            f.write(
                json.dumps({"id": str(rec.get("id", i)), "contents": contents}, ensure_ascii=False) + "\n"
            )
            n += 1
    return n


def iter_corpus(path: str | Path) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (byte offset, record) for every non-blank line, validating each one."""
    path = Path(path)
    offset = 0
    with path.open("rb") as f:
        for line_no, line in enumerate(f, start=1):
            if line.strip():
                yield offset, parse_record(line, f"{path}:{line_no}")
            offset += len(line)


def scan_offsets(path: str | Path, validate: bool = True) -> np.ndarray:
    """Byte offsets of every passage line; with `validate`, every line is parsed (bad lines raise)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"corpus file not found: {path}")
    offsets: list[int] = []
    if validate:
        offsets = [off for off, _ in iter_corpus(path)]
    else:
        offset = 0
        with path.open("rb") as f:
            for line in f:
                if line.strip():
                    offsets.append(offset)
                offset += len(line)
    return np.asarray(offsets, dtype=np.int64)


class DocStore:
    """Random access to corpus passages by row number (the index's document number).

    Row i is the i-th non-blank line of the file, which is what Search-R1's prebuilt indexes assume.
    """

    def __init__(self, path: str | Path, offsets: np.ndarray | None = None, validate: bool = True):
        self.path = Path(path)
        self.offsets = offsets if offsets is not None else scan_offsets(self.path, validate=validate)
        self._file = self.path.open("rb")
        size = self.path.stat().st_size
        self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else None

    @classmethod
    def open_cached(cls, path: str | Path, cache_dir: str | Path | None) -> DocStore:
        """Open with offsets cached in `cache_dir/doc_offsets.npy` (reused when the corpus size and mtime match)."""
        path = Path(path)
        if cache_dir is None:
            return cls(path)
        cache_dir = Path(cache_dir)
        stat = path.stat()
        stamp = f"{stat.st_size}:{int(stat.st_mtime)}"
        off_file, stamp_file = cache_dir / "doc_offsets.npy", cache_dir / "doc_offsets.stamp"
        if off_file.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
            # memory-mapped: server workers share the pages; a plain ndarray view skips memmap's Python indexing
            return cls(path, offsets=np.load(off_file, mmap_mode="r").view(np.ndarray))
        store = cls(path)
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            np.save(off_file, store.offsets)
            stamp_file.write_text(stamp)
        except OSError:
            pass  # a read-only index dir just means no cache
        return store

    def __len__(self) -> int:
        return int(self.offsets.shape[0])

    def _line(self, i: int) -> bytes:
        start = int(self.offsets[i])
        end = self._mm.find(b"\n", start)
        return self._mm[start : end if end >= 0 else len(self._mm)]

    def _where(self, i: int) -> str:
        return f"{self.path} (passage row {i})"

    def _check_row(self, i: int) -> None:
        if not 0 <= i < len(self):
            raise IndexError(f"document row {i} out of range (corpus has {len(self)} passages)")

    def get(self, i: int) -> dict[str, str]:
        """Passage at row `i` as {"id", "contents"}."""
        self._check_row(i)
        return parse_record(self._line(i), self._where(i))

    def get_many(self, rows: Iterable[int]) -> list[dict[str, str]]:
        """Passages at `rows`, decoded with one `json.loads` over all their lines (a batch's hits cost one C call,
        not one per passage); a line that does not decode on its own is reported by `get`."""
        rows = [int(i) for i in rows]
        if not rows:
            return []
        lines = []
        for i in rows:
            self._check_row(i)
            lines.append(self._line(i))
        try:
            objs = json.loads(b"[" + b",".join(lines) + b"]")
        except (json.JSONDecodeError, UnicodeDecodeError):
            objs = None
        # some line is not exactly one JSON value: `get` finds and names it
        if objs is None or len(objs) != len(rows):
            return [self.get(i) for i in rows]
        records = []
        for i, obj in zip(rows, objs, strict=True):
            try:
                records.append(record_from_json(obj, ""))
            except CorpusError:  # only a bad line pays for naming itself
                records.append(record_from_json(obj, self._where(i)))
        return records

    def iter_contents(self) -> Iterator[str]:
        for i in range(len(self)):
            yield self.get(i)["contents"]

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
        self._file.close()

    def __enter__(self) -> DocStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
