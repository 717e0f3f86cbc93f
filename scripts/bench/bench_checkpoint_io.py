"""What a checkpoint's manifest costs: writing a few GB with fsync, then checksumming them back with CRC-32 (what the
manifest uses), Adler-32, SHA-256 and BLAKE2b.

    python scripts/bench/bench_checkpoint_io.py                 # 3 GB in a temporary directory under /tmp
    python scripts/bench/bench_checkpoint_io.py --gb 8 --dir /scratch/run/checkpoints

Printed per row: GB/s of one thread, seconds for a 50 GB checkpoint at that rate, and the time against the write
(with fsync) of the same bytes. The file is read once before the checksums, so they read from the page cache, as
they do right after a checkpoint is written (learner/checkpoints/files.py). `crc32 x4` checksums four quarters of
the data on four threads, as `checksum_files` does for a checkpoint's files.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CHUNK = 8 << 20


def _write(path: Path, size: int) -> float:
    block = os.urandom(64 << 20)
    start = time.perf_counter()
    with open(path, "wb") as handle:
        for offset in range(0, size, len(block)):
            handle.write(block[: min(len(block), size - offset)])
        handle.flush()
        os.fsync(handle.fileno())
    return time.perf_counter() - start


def _digest(path: Path, update) -> float:
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    state = None
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as handle:
        while read := handle.readinto(buffer):
            state = update(state, view[:read])
    return time.perf_counter() - start


def _hashlib(name: str):
    def update(state, data):
        state = state or hashlib.new(name)
        state.update(data)
        return state

    return update


def main(argv: list[str] | None = None) -> int:
    from learner.checkpoints.files import checksum_files

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gb", type=float, default=3.0, help="how much to write and read back")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where (default: a temporary directory in /tmp)"
    )
    args = parser.parse_args(argv)
    size = int(args.gb * 1e9)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        quarters = [Path(tmp) / f"part{i}.bin" for i in range(4)]
        written = sum(_write(path, size // 4) for path in quarters)
        for path in quarters:
            _digest(path, lambda state, data: None)  # into the page cache
        rows = {"read only": sum(_digest(p, lambda state, data: None) for p in quarters)}
        rows["crc32"] = sum(_digest(p, lambda s, d: zlib.crc32(d, s or 0)) for p in quarters)
        rows["adler32"] = sum(
            _digest(p, lambda s, d: zlib.adler32(d, 1 if s is None else s)) for p in quarters
        )
        rows["sha256"] = sum(_digest(p, _hashlib("sha256")) for p in quarters)
        rows["blake2b"] = sum(_digest(p, _hashlib("blake2b")) for p in quarters)
        start = time.perf_counter()
        checksum_files(Path(tmp), [p.name for p in quarters], threads=4)
        rows["crc32 x4"] = time.perf_counter() - start
    print(f"{size / 1e9:.1f} GB written with fsync in {written:.1f} s ({size / written / 1e9:.2f} GB/s)")
    print(f"{'':10s} {'GB/s':>6s} {'s per 50 GB':>12s} {'vs write':>9s}")
    for name, seconds in rows.items():
        rate = size / seconds / 1e9
        print(f"{name:10s} {rate:6.2f} {50 / rate:12.1f} {seconds / written:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
