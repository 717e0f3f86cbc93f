"""The tiny world of the embedded default: a synthetic knowledge base, its corpus, its questions and a warm policy.

    world = build_world(Path("runs/.world-cache/seed0"), seed=0)    # cached per directory and parameters
    world.corpus_path, world.train_path, world.test_path, world.model_dir

Everything is generated from one seed, offline, on two CPU cores: the knowledge base, corpus and questions
(`kb.py`), a byte-level BPE tokenizer and a small `Qwen2ForCausalLM` (`model.py`), and a supervised warm start on
search trajectories built with the retrieval server's BM25 (`warmstart.py`). Seed 0's world is shipped (built from a
random init: 2,500 warm-start steps); any other seed's policy starts from the shipped one, its word rows renamed
to the seed's words (`transfer.py`), and takes two epochs of the warm start (250 steps): under a minute.

Room for RL. The warm-start trajectories search either with the full name (`Velmora Tesk born`, the right passage
comes first) or, more often, with the first name only (`Velmora born`, the passage of one of the several people who
share that first name comes first); the answer always copies the attribute of the first passage. Greedy decoding
therefore prefers the imperfect query and gets a low exact match; sampling at temperature 1 sometimes writes the
full name and is rewarded, which is what RL then reinforces. `python scripts/tiny_world.py --check` shows it.

What is the same everywhere. A seed gives byte-identical corpus, questions and tokenizer on every machine (Python's
seeded `random`, a single-threaded BPE trainer). The warm-started weights are not promised byte for byte: training
sums floating-point numbers, and another summation order (another CPU vendor's library path, another vector width)
changes their last bits, which the warm start amplifies. The build narrows that: it runs in a child process whose
math libraries are pinned to one code path and two threads (`PINNED_ENV`: MKL's conditional numerical
reproducibility, ATen's and oneDNN's AVX2 kernels) with torch's deterministic algorithms, so one machine always
builds the same bytes. But MKL's documentation says a fixed branch holds on Intel CPUs only (on others it takes
its automatic branch instead), and an AMD EPYC machine built other weights. What is promised instead is the policy's behaviour before RL (`world.probe`: greedy exact match, the
query it writes, the answer copy), which other summation orders left unchanged;
`tests/integration/test_world_determinism.py` checks both promises. ARM machines (Apple silicon) build a world of
the same kind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.processes import die_with_parent
from common.progress import PhaseProgress, format_seconds
from retrieval.bm25 import BM25Retriever
from retrieval.corpus import DocStore
from world.kb import DATA_SOURCE, WorldSizes, build_kb, write_corpus, write_questions
from world.transfer import TRANSFER_EPOCHS
from world.warmstart import build_trajectories, warm_start

__all__ = [
    "DATA_SOURCE",
    "MARKER_FILE",
    "SHIPPED_DIR",
    "TinyWorld",
    "WorldSizes",
    "build_world",
    "shipped_world",
]

log = logging.getLogger(__name__)

MARKER_FILE = "tiny_world.json"
# the default world (seed 0, default sizes), built once by `python scripts/tiny_world.py --out world/shipped/seed0
# --force --no-shipped` and committed (2.7 MB): a first `make run`, CI and every test suite skip its warm start, the
# largest part of a first run on a slow CPU; `tests/integration/test_world_determinism.py` rebuilds it and compares
SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
DATA_S = 10  # about how long the corpus, questions and trajectories take on a 2-core VM (the estimate shown)
# 2: warm-start observations from the retrieval server's BM25; 3-4: built with PINNED_ENV; 5: the lean forward on one
# thread, 1,000 trajectories; 6: back to 4's recipe (5 left RL too little to learn: docs/tiny-world.md)
WORLD_VERSION = 6
# the environment of the child process that builds a world: one code path and one split of every reduction on any
# Intel CPU with AVX2, whatever its vector width or core count (on other vendors' CPUs MKL ignores MKL_CBWR and
# takes its automatic branch, so AMD machines still round differently); pinning to the pre-AVX2 baseline instead was measured 2-3x slower per op,
# which would take a first `make run` past ten minutes
PINNED_ENV = {
    "MKL_CBWR": "AVX2,STRICT",  # MKL: the AVX2 code path and reduction order, also on AVX-512 CPUs
    "ATEN_CPU_CAPABILITY": "avx2",  # ATen: its AVX2 kernels, not the AVX-512 ones
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    # two threads: the same split of every reduction whatever the core count. One thread would not spin waiting for
    # a core another process holds (two made each step 5-25x slower on a busy 2-core VM, 2026-11-28), but its build
    # (with the lean forward) left RL less to learn; the recipe stays the one measured (docs/tiny-world.md)
    "OMP_NUM_THREADS": "2",
    "MKL_NUM_THREADS": "2",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONHASHSEED": "0",
}


@dataclass(frozen=True)
class TinyWorld:
    corpus_path: Path
    train_path: Path
    test_path: Path
    model_dir: Path  # warm-started HF model + tokenizer (fp32 safetensors)


def _paths(out_dir: Path) -> TinyWorld:
    return TinyWorld(
        out_dir / "corpus.jsonl", out_dir / "train.parquet", out_dir / "test.parquet", out_dir / "model"
    )


def _marker(seed: int, sizes: WorldSizes, transferred: bool = False) -> dict[str, Any]:
    marker = {"version": WORLD_VERSION, "seed": seed, "sizes": dataclasses.asdict(sizes)}
    if transferred:  # its warm start started from the shipped seed-0 policy (world.transfer)
        marker["warm_start_from"] = {"seed": 0, "version": WORLD_VERSION, "epochs": TRANSFER_EPOCHS}
    return marker


def build_world(
    out_dir: Path,
    seed: int = 0,
    *,
    progress: bool = True,
    since: float | None = None,
    shipped: bool = True,
    **sizes: Any,
) -> TinyWorld:
    """Build (or find cached) the tiny world in `out_dir`: corpus, train/test parquet and the warm-started model.

    Returns at once when `out_dir` already holds a complete world built with the same seed and sizes. The default
    world (seed 0, default sizes) is copied from the one shipped in the package (`SHIPPED_DIR`) unless `shipped` is
    false; any other seed or size is built, another seed of the default sizes starting its warm start from the
    shipped policy (`world.transfer`: two epochs instead of twenty) unless `shipped` is false. `sizes` are
    `WorldSizes` fields (e.g. `num_people=200`). With `progress`, the build says what it does and, once, how long it
    took in all (counted from `since`, a `time.time()`, when given).
    """
    unknown = set(sizes) - {f.name for f in dataclasses.fields(WorldSizes)}
    if unknown:
        raise TypeError(f"unknown tiny-world sizes {sorted(unknown)}; expected fields of WorldSizes")
    world_sizes = WorldSizes(**sizes)
    out_dir = Path(out_dir)
    world = _paths(out_dir)
    marker_path = out_dir / MARKER_FILE
    base = transfer_base(seed, world_sizes) if shipped else None
    wanted = _marker(seed, world_sizes, base is not None)
    if _is_built(world, marker_path, wanted):
        log.info("tiny world: cached in %s", out_dir)
        return world
    source = shipped_world(seed, world_sizes) if shipped else None
    if source is not None and source.resolve() != out_dir.resolve():
        with _build_lock(out_dir, progress):
            if not _is_built(world, marker_path, wanted):
                _copy_world(source, out_dir)
        if progress:
            print(
                f"[tiny world] seed {seed}: the shipped copy ({source}), installed into {out_dir}", flush=True
            )
        return world
    if not pinned():
        # the build itself runs in a child process with the math libraries pinned (they read these at load time)
        cmd = [
            sys.executable,
            "-m",
            "world",
            "--out",
            str(out_dir),
            "--seed",
            str(seed),
            "--sizes",
            json.dumps(sizes),
            "--since",
            str(time.time()),
        ]
        cmd += ([] if progress else ["--quiet"]) + ([] if shipped else ["--no-shipped"])
        # one build at a time per directory: a second `sr1 run` (or test) started meanwhile waits for it, then finds
        # the world built
        with _build_lock(out_dir, progress):
            if _is_built(world, marker_path, wanted):
                return world
            marker_path.unlink(missing_ok=True)
            if progress:
                print(
                    f"[tiny world] building seed {seed} into {out_dir} (once per seed and size)", flush=True
                )
            # the build dies with whoever started it (a killed `sr1 run` leaves no build running)
            subprocess.run(cmd, env=os.environ | PINNED_ENV, check=True, preexec_fn=die_with_parent)
        if not marker_path.exists():
            raise RuntimeError(f"the tiny world build in {out_dir} ended without its marker file")
        return world

    marker_path.unlink(missing_ok=True)  # a build cut short leaves no marker behind
    started = time.time() if since is None else since
    # every step shows progress (nothing silent for more than 10 s) but only this function reports the world's
    # time, once, at the end: the steps' own closing lines are off
    with PhaseProgress(
        "tiny world: the corpus, questions and warm-start trajectories",
        expected_s=DATA_S,
        enabled=progress,
        report_done=False,
        announce=True,
    ):
        kb = build_kb(seed, world_sizes)
        write_corpus(kb, world.corpus_path)
        write_questions(kb.train, world.train_path)
        write_questions(kb.test, world.test_path)
        # the retrieval server's own BM25 (same tokenizer, stemmer, k1/b and ranking) over the corpus just written
        bm25 = BM25Retriever.build(DocStore(world.corpus_path), k1=0.9, b=0.4, threads=1)
        trajectories = build_trajectories(
            kb,
            lambda queries: bm25.search(queries, 3),
            world_sizes.num_warmstart,
            world_sizes.good_query_share,
            seed,
        )
    base_kb = build_kb(0, world_sizes) if base is not None else None
    steps = warm_start(
        kb,
        trajectories,
        world.model_dir,
        world_sizes,
        seed=seed,
        progress=progress,
        base_dir=base,
        base_kb=base_kb,
    )
    marker_path.write_text(json.dumps(wanted, indent=2))
    if progress:
        start = "from the shipped seed-0 policy" if base is not None else "from a random init"
        print(
            f"[tiny world] seed {seed} built in {format_seconds(time.time() - started)} "
            f"({steps} warm-start steps {start})",
            flush=True,
        )
    return world


def transfer_base(seed: int, sizes: WorldSizes) -> Path | None:
    """The policy a seed's warm start starts from (`world.transfer`): the shipped seed-0 one for any other seed
    whose sizes are the shipped world's, when the package holds it; None (a random init) otherwise."""
    if seed == 0:
        return None
    source = shipped_world(0, sizes)
    return None if source is None else _paths(source).model_dir


def shipped_world(seed: int, sizes: WorldSizes) -> Path | None:
    """The shipped copy of the world of `seed` and `sizes`, if the package holds one built by this recipe (its
    marker names this `WORLD_VERSION`, seed and sizes); None otherwise."""
    source = SHIPPED_DIR / f"seed{seed}"
    if not _is_built(_paths(source), source / MARKER_FILE, _marker(seed, sizes)):
        return None
    return source


def _copy_world(source: Path, out_dir: Path) -> None:
    """Copy a built world into `out_dir`, its marker last (a copy cut short leaves no marker: it is copied again)."""
    built, copy = _paths(source), _paths(out_dir)  # the layout is _paths' alone
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MARKER_FILE).unlink(missing_ok=True)
    if copy.model_dir.exists():
        shutil.rmtree(copy.model_dir)
    shutil.copytree(built.model_dir, copy.model_dir)
    for src, dst in (
        (built.corpus_path, copy.corpus_path),
        (built.train_path, copy.train_path),
        (built.test_path, copy.test_path),
    ):
        shutil.copyfile(src, dst)
    shutil.copyfile(source / MARKER_FILE, out_dir / MARKER_FILE)


def _is_built(world: TinyWorld, marker_path: Path, wanted: dict) -> bool:
    """Whether the world's files are there and its marker says they were built with these parameters."""
    complete = all(
        p.exists() for p in (world.corpus_path, world.train_path, world.test_path, world.model_dir)
    )
    return complete and marker_path.exists() and json.loads(marker_path.read_text()) == wanted


@contextlib.contextmanager
def _build_lock(out_dir: Path, progress: bool):
    """An exclusive lock on `out_dir`'s build (a file beside it), held by the process that starts the build."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / f".{out_dir.name}.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                print(f"[tiny world] another process is building {out_dir}: waiting for it", flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def pinned() -> bool:
    """Whether this process runs with `PINNED_ENV` (the world build's child process does)."""
    return all(os.environ.get(key) == value for key, value in PINNED_ENV.items())
