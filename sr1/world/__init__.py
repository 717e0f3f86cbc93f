"""The tiny world of the embedded default: a synthetic knowledge base, its corpus, its questions and a warm policy.

    world = build_world(Path("runs/.world-cache/seed0"), seed=0)    # cached per directory and parameters
    world.corpus_path, world.train_path, world.test_path, world.model_dir

Everything is generated from one seed, offline, in about two minutes on two CPU cores: the knowledge base, corpus
and questions (`kb.py`), a byte-level BPE tokenizer and a small `Qwen2ForCausalLM` (`model.py`), and a supervised
warm start on search trajectories built with the retrieval server's BM25 (`warmstart.py`).

Room for RL. The warm-start trajectories search either with the full name (`Velmora Tesk born`, the right passage
comes first) or, more often, with the first name only (`Velmora born`, the passage of one of the several people who
share that first name comes first); the answer always copies the attribute of the first passage. Greedy decoding
therefore prefers the imperfect query and gets a low exact match; sampling at temperature 1 sometimes writes the
full name and is rewarded, which is what RL then reinforces. `python scripts/tiny_world.py --check` shows it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sr1.world.kb import DATA_SOURCE, WorldSizes, build_kb, write_corpus, write_questions
from sr1.world.warmstart import build_trajectories, warm_start

__all__ = ["DATA_SOURCE", "MARKER_FILE", "TinyWorld", "WorldSizes", "build_world"]

log = logging.getLogger(__name__)

MARKER_FILE = "tiny_world.json"
WORLD_VERSION = 2  # 2: warm-start observations from the retrieval server's BM25


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


def _marker(seed: int, sizes: WorldSizes) -> dict[str, Any]:
    return {"version": WORLD_VERSION, "seed": seed, "sizes": dataclasses.asdict(sizes)}


def build_world(out_dir: Path, seed: int = 0, *, progress: bool = True, **sizes: Any) -> TinyWorld:
    """Build (or find cached) the tiny world in `out_dir`: corpus, train/test parquet and the warm-started model.

    Returns at once when `out_dir` already holds a complete world built with the same seed and sizes.
    `sizes` are `WorldSizes` fields (e.g. `num_people=200`, `hidden_size=256`).
    """
    from retrieval.bm25 import BM25Retriever
    from retrieval.corpus import DocStore

    unknown = set(sizes) - {f.name for f in dataclasses.fields(WorldSizes)}
    if unknown:
        raise TypeError(f"unknown tiny-world sizes {sorted(unknown)}; expected fields of WorldSizes")
    world_sizes = WorldSizes(**sizes)
    out_dir = Path(out_dir)
    world = _paths(out_dir)
    marker_path = out_dir / MARKER_FILE
    wanted = _marker(seed, world_sizes)
    complete = all(
        p.exists() for p in (world.corpus_path, world.train_path, world.test_path, world.model_dir)
    )
    if complete and marker_path.exists() and json.loads(marker_path.read_text()) == wanted:
        log.info("tiny world: cached in %s", out_dir)
        return world
    marker_path.unlink(missing_ok=True)

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
    warm_start(kb, trajectories, world.model_dir, world_sizes, seed=seed, progress=progress)
    marker_path.write_text(json.dumps(wanted, indent=2))
    return world
