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

RUNS_ROOT = Path("runs")
EMBEDDED_MODELS = ("tiny", "tiny-qwen2.5")
WORLD_CACHE = RUNS_ROOT / ".world-cache"


def build_embedded(model: str, seed: int, *, progress: bool = True) -> tuple[Path, tuple[Path, Path, Path]]:
    """The embedded `model`'s directory and its (train, test, corpus) files for `seed`, built when not cached."""
    if model == "tiny":
        from world import build_world

        world = build_world(WORLD_CACHE / f"seed{seed}", seed=seed, progress=progress)
        return world.model_dir, (world.train_path, world.test_path, world.corpus_path)
    if model == "tiny-qwen2.5":
        from world.flashrag import build_rehearsal
        from world.qwen import build_qwen_shaped

        model_dir = build_qwen_shaped(WORLD_CACHE / f"qwen2.5-shaped-seed{seed}", seed=seed)
        return Path(model_dir), build_rehearsal(WORLD_CACHE / f"rehearsal-seed{seed}", seed=seed)
    raise ValueError(f"{model!r} is not an embedded model ({', '.join(EMBEDDED_MODELS)})")
