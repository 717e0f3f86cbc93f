"""A checkpoint's files on disk: written durably, listed in a manifest, checked before they are loaded.

    entries = checksum_files(directory, ["model.safetensors", "resume/state.json"])   # {path: FileEntry}
    write_manifest(directory, entries)           # sr1-manifest.json: every file's size and CRC-32
    problems = verify_files(directory, entries)  # [] when every file has its size and checksum
    fsync_tree(directory); atomic_write_text(path, text)
    remove_tree(root / "step_4")                 # renamed to .step_4.stale (atomic), then deleted

The manifest is one more JSON file beside `config.json`: transformers, vLLM and Search-R1's scripts load the
directory as before (they read the files they know and ignore the rest).

Checksum: CRC-32 (`zlib.crc32`) of each whole file, read back in 8 MiB chunks once the file is written, on up to
`HASH_THREADS` threads (zlib releases the GIL on large buffers). It catches what tears a checkpoint: files cut short,
holes, blocks of zeros, flipped bits; it is no defence against someone who edits a file on purpose. Chosen for speed:
on this project's VM one thread checksums 5.5 GB/s from the page cache with CRC-32, 1.8 GB/s with SHA-256 and 1.3
GB/s with BLAKE2b, while writing the same bytes with fsync ran at 0.37 GB/s (`python scripts/bench/bench_checkpoint_io.py`,
docs/measurements/crashes-and-checkpoints.md); xxhash is not a dependency.

A test hook stands in for a full disk where no size-limited filesystem can be mounted: while the file named by the
environment variable `SR1TEST_DISK_FULL` exists, the files the checkpoint writer writes itself (the safetensors
weights, copied model files, RNG states, manifest, resume state) fail with ENOSPC once one save has written as many
bytes as the file holds (empty: none). Writes of torch.distributed.checkpoint (the optimizer shards) are not hooked;
a real full disk fails them the same way (`storage_error` finds the OSError behind either).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import zlib
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = "sr1-manifest.json"
MANIFEST_FORMAT = 1
CHUNK_BYTES = 8 << 20
HASH_THREADS = 4
DISK_FULL_ENV = "SR1TEST_DISK_FULL"  # not SR1_...: the config reads those as settings (SR1_LEARNER__LR)
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: its path relative to the checkpoint directory, its size and CRC-32."""

    path: str
    size: int
    crc32: int


class ManifestError(ValueError):
    """A manifest that cannot be read (missing, cut short, not the expected JSON)."""


def file_crc32(path: Path) -> tuple[int, int]:
    """(size, CRC-32) of the file as it reads back now."""
    crc, size = 0, 0
    buffer = bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while read := handle.readinto(buffer):
            crc = zlib.crc32(view[:read], crc)
            size += read
    return size, crc


def checksum_files(root: Path, paths: Iterable[str], threads: int = HASH_THREADS) -> dict[str, FileEntry]:
    """Read each file (relative to `root`) back and checksum it, a few files at a time."""
    paths = sorted(paths)

    def one(rel: str) -> FileEntry:
        size, crc = file_crc32(root / rel)
        return FileEntry(rel, size, crc)

    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(paths)))) as pool:
        return {entry.path: entry for entry in pool.map(one, paths)}


def files_under(root: Path) -> list[str]:
    """Every regular file below `root`, as paths relative to it (the manifest itself left out)."""
    return sorted(
        p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != MANIFEST
    )


def write_manifest(root: Path, entries: dict[str, FileEntry], **meta: Any) -> None:
    body = {
        "format": MANIFEST_FORMAT,
        "checksum": "crc32",
        **meta,
        "total_bytes": sum(e.size for e in entries.values()),
        "files": {p: {"size": e.size, "crc32": e.crc32} for p, e in sorted(entries.items())},
    }
    write_durably(root / MANIFEST, json.dumps(body, indent=1).encode())


def read_manifest(root: Path) -> tuple[dict[str, FileEntry], dict[str, Any]]:
    """The manifest's entries and the whole document; ManifestError when it is missing or unreadable."""
    path = root / MANIFEST
    try:
        body = json.loads(path.read_text())
        files = body["files"]
        entries = {p: FileEntry(p, int(f["size"]), int(f["crc32"])) for p, f in files.items()}
    except FileNotFoundError as err:
        raise ManifestError(f"no {MANIFEST}") from err
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ManifestError(f"{MANIFEST} is unreadable ({type(err).__name__}: {err})") from err
    return entries, body


def check_sizes(root: Path, entries: Iterable[FileEntry]) -> list[str]:
    """What is wrong with the files' sizes (missing, cut short, grown): cheap, no file is read."""
    problems = []
    for entry in entries:
        try:
            size = (root / entry.path).stat().st_size
        except FileNotFoundError:
            problems.append(f"{entry.path} is missing")
            continue
        if size != entry.size:
            how = "cut short" if size < entry.size else "longer than written"
            problems.append(f"{entry.path} has {size} bytes, the manifest says {entry.size} ({how})")
    return problems


def verify_files(root: Path, entries: Iterable[FileEntry], threads: int = HASH_THREADS) -> list[str]:
    """What is wrong with these files against their manifest entries: sizes first, then checksums."""
    entries = list(entries)
    problems = check_sizes(root, entries)
    if problems:
        return problems
    found = checksum_files(root, [e.path for e in entries], threads) if entries else {}
    return [
        f"{e.path}: CRC-32 {found[e.path].crc32:08x}, the manifest says {e.crc32:08x} (corrupt)"
        for e in entries
        if found[e.path].crc32 != e.crc32
    ]


# -- durable writes -------------------------------------------------------------------------------------------------


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (files created, renamed, removed in it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every directory below `root`, deepest first, and `root` itself (the files are synced as written)."""
    for directory in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        fsync_dir(directory)
    fsync_dir(root)


def write_durably(path: Path, data: bytes, budget: WriteBudget | None = None) -> None:
    """Write a whole file and fsync it (charged to `budget`: the disk-full test hook)."""
    with open(path, "wb") as handle:
        (budget or WriteBudget()).write(handle, data, path)
        handle.flush()
        os.fsync(handle.fileno())


def atomic_write_text(path: Path, text: str) -> None:
    """Replace `path` with `text` all at once: a temporary file, fsynced, renamed over it, the directory fsynced."""
    tmp = path.with_name(f".{path.name}.tmp")
    write_durably(tmp, text.encode())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def remove_tree(path: Path) -> None:
    """Delete a directory without ever leaving it half-deleted under its own name: it is renamed aside (atomic; the
    parent fsynced), then deleted. A reader listing `step_*` sees it whole or not at all; a crash mid-delete leaves
    only the `.stale` name, which the next start clears."""
    moved = path.with_name(f".{path.name}.stale")
    shutil.rmtree(moved, ignore_errors=True)
    path.rename(moved)
    fsync_dir(path.parent)
    shutil.rmtree(moved, ignore_errors=True)


def clear_stale(root: Path) -> list[Path]:
    """Delete what a crash left of `remove_tree`s under `root` (`.<name>.stale`); returns what it deleted."""
    stale = sorted(root.glob(".*.stale"))
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


class WriteBudget:
    """How many more bytes one save may write before the disk-full test hook fails it (None: no limit, the hook is
    off). Read once per save from the file `SR1TEST_DISK_FULL` names (see the module's docstring)."""

    def __init__(self, left: int | None = None):
        self.left = left

    @classmethod
    def from_env(cls) -> WriteBudget:
        trigger = os.environ.get(DISK_FULL_ENV)
        if not trigger or not os.path.exists(trigger):
            return cls()
        text = Path(trigger).read_text().strip()
        return cls(int(text) if text else 0)

    def write(self, handle, data: bytes | memoryview, path: Path) -> None:
        """`handle.write(data)`; with the hook on, only what is left of the budget is written, then ENOSPC."""
        if self.left is not None and len(data) > self.left:
            handle.write(data[: self.left])
            self.left = 0
            handle.flush()
            raise OSError(errno.ENOSPC, f"No space left on device (injected by {DISK_FULL_ENV})", str(path))
        handle.write(data)
        if self.left is not None:
            self.left -= len(data)


# -- what failed a save ---------------------------------------------------------------------------------------------


def storage_error(err: BaseException) -> OSError | None:
    """The OSError behind a failed write, or None for a failure of another kind (a bug: not a storage problem).
    Looks through the exception's causes and through torch.distributed.checkpoint's CheckpointException, which
    carries each rank's own exception."""
    seen: set[int] = set()
    todo = [err]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError):
            return current
        failures = getattr(current, "failures", None)
        if isinstance(failures, dict):
            todo += [pair[0] if isinstance(pair, tuple) else pair for pair in failures.values()]
        todo += [current.__cause__, current.__context__]
    return None


def is_no_space(err: OSError | None) -> bool:
    return err is not None and err.errno in NO_SPACE_ERRNOS
