"""The embedded models `sr1 run` builds itself (`sr1 world` builds one ahead of a run: `sr1.run.world_main`).

    sr1 world                      # the tiny world `sr1 run` would train on (seed 0), built unless cached
    sr1 world seed=101             # any of `sr1 run`'s arguments: the same world that run would use

`tiny` is the tiny world (a warm-started tiny policy on its synthetic knowledge base, `world/`); `tiny-qwen2.5` a
small random model with Qwen2.5's real tokenizer and chat template on the tiny knowledge base laid out as the
FlashRAG downloads (the CPU rehearsal of the real workflow). Both are cached under `runs/.world-cache/`, one
directory per seed. `make run` starts `sr1 world` with its ARGS while the install is still fetching what only the
run needs, so the world is ready when the run starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from world import build_world
from world.flashrag import build_rehearsal
from world.qwen import build_qwen_shaped

if TYPE_CHECKING:  # config/ imports torch (the learner's settings): `sr1 world` does without it
    from config import Config

RUNS_ROOT = Path("runs")
EMBEDDED_MODELS = ("tiny", "tiny-qwen2.5")
WORLD_CACHE = RUNS_ROOT / ".world-cache"


def build_embedded(model: str, seed: int, *, progress: bool = True) -> tuple[Path, tuple[Path, Path, Path]]:
    """The embedded `model`'s directory and its (train, test, corpus) files for `seed`, built when not cached."""
    if model == "tiny":
        world = build_world(WORLD_CACHE / f"seed{seed}", seed=seed, progress=progress)
        return world.model_dir, (world.train_path, world.test_path, world.corpus_path)
    if model == "tiny-qwen2.5":
        model_dir = build_qwen_shaped(WORLD_CACHE / f"qwen2.5-shaped-seed{seed}", seed=seed)
        return Path(model_dir), build_rehearsal(WORLD_CACHE / f"rehearsal-seed{seed}", seed=seed)
    raise ValueError(f"{model!r} is not an embedded model ({', '.join(EMBEDDED_MODELS)})")


def _update(cfg: Config, section: str, **values: Any) -> Config:
    return cfg.model_copy(update={section: getattr(cfg, section).model_copy(update=values)})


def with_embedded_world(cfg: Config) -> Config:
    """`cfg` (whose `model.path` is an embedded model) with the embedded model, and its data and corpus where the
    user gave none (theirs always win): what `sr1 run` trains on.

    `tiny`: the tiny world (a warm-started tiny policy on its synthetic knowledge base). `tiny-qwen2.5`: a small
    random model with Qwen2.5's real tokenizer and chat template, on the tiny knowledge base laid out as the
    FlashRAG downloads and prepared by `sr1 data prepare` (the CPU rehearsal of the real workflow)."""
    model_dir, files = build_embedded(cfg.model.path, cfg.seed)
    train, test, corpus = (Path(f).resolve() for f in files)
    cfg = _update(cfg, "model", path=str(Path(model_dir).resolve()))
    given = cfg.data.model_fields_set
    retriever = cfg.retrieval.retriever
    given_corpus = "corpus_path" in retriever.model_fields_set
    fill = {"train_files": [train], "test_files": [test]}
    cfg = _update(cfg, "data", **{k: v for k, v in fill.items() if k not in given})
    if "corpus_path" in type(retriever).model_fields and not given_corpus:
        cfg = _update(cfg, "retrieval", retriever=retriever.model_copy(update={"corpus_path": corpus}))
    kept = sorted(
        {f"data.{k}" for k in fill if k in given}
        | ({"retrieval.retriever.corpus_path"} if given_corpus else set())
    )
    if kept:
        print(
            f"sr1 run: the embedded model with your {', '.join(kept)} (the embedded world fills in the rest)"
        )
    return cfg
