"""The embedded models `sr1 run` builds itself, and `sr1 world`, which builds one ahead of a run.

    sr1 world                      # the tiny world `sr1 run` would train on (seed 0), built unless cached
    sr1 world seed=101             # any preset and overrides `sr1 run` takes: the same world that run would use

`tiny` is the tiny world (a warm-started tiny policy on its synthetic knowledge base, `world/`); `tiny-qwen2.5` a
small random model with Qwen2.5's real tokenizer and chat template on the tiny knowledge base laid out as the
FlashRAG downloads (the CPU rehearsal of the real workflow). Both are cached under `runs/.world-cache/`, one
directory per seed. `make run` starts `sr1 world` with its ARGS while the install is still fetching what only the
run needs, so the world is ready when the run starts.
"""

from __future__ import annotations

import sys
from pathlib import Path

from config import ConfigError

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


def main(argv: list[str] | None = None) -> int:
    """`sr1 world` takes `sr1 run`'s arguments (its run-only flags change nothing here)."""
    from sr1.run import _resolve, build_parser, parse_args

    args = parse_args(build_parser(prog="sr1 world", description=__doc__.splitlines()[0]), argv)
    try:
        cfg, _ = _resolve(args)
    except ConfigError as err:
        print(f"sr1 world: {err}", file=sys.stderr)
        return 2
    if cfg.model.path not in EMBEDDED_MODELS:
        print(f"sr1 world: model.path {cfg.model.path!r} is not embedded: nothing to build")
        return 0
    model_dir, _ = build_embedded(cfg.model.path, cfg.seed)
    print(f"sr1 world: {cfg.model.path} (seed {cfg.seed}) ready in {model_dir.parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
