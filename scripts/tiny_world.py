"""Build the tiny world of the embedded default into a directory, and check that it leaves room for RL.

    python scripts/tiny_world.py --out runs/tiny_world --seed 0            # corpus, parquet, warm-started model
    python scripts/tiny_world.py --out runs/tiny_world --check             # + greedy / forced-query exact match
    python scripts/tiny_world.py --set hidden_size=256 --set num_people=200   # other sizes (WorldSizes fields)

The output directory holds `corpus.jsonl` (Search-R1 wiki-18 JSONL), `train.parquet` / `test.parquet` (Search-R1
layout), `model/` (HF safetensors + tokenizer) and `tiny_world.json` (the parameters; a second run with the same
ones returns at once).

`--check` runs `world.probe.probe_policy` on test questions (the real agent loop with a transformers engine and
the world's BM25 in process): greedy, with the first turn forced to search with the full name ("good": shows the
answer-copy step works) or the first name only ("imperfect"), and sampled at temperature 1. It reports exact match,
the share of well-formed trajectories and how often the model's own query was the good or the imperfect one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _parse_sets(items: list[str]) -> dict[str, object]:
    from world import WorldSizes

    defaults = WorldSizes()
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not hasattr(defaults, key):
            names = sorted(vars(defaults))
            raise SystemExit(f"--set expects FIELD=VALUE with FIELD one of {names}; got {item!r}")
        kind = type(getattr(defaults, key))
        if kind is bool:
            out[key] = value.lower() in ("1", "true", "yes")
        else:
            out[key] = kind(value)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("runs/tiny_world"), help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="world and model seed")
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="a WorldSizes field"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when the directory is up to date")
    parser.add_argument(
        "--no-shipped",
        action="store_true",
        help="use nothing shipped in world/shipped/: build the default world (seed 0) instead of copying it, and\n"
        "start another seed's warm start from a random init, not from the shipped policy",
    )
    parser.add_argument(
        "--check", action="store_true", help="evaluate the warm-started policy on test questions"
    )
    parser.add_argument("--questions", type=int, default=100, help="test questions for --check")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)

    import logging

    from rich.logging import RichHandler

    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[RichHandler(show_path=False)])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from world import MARKER_FILE, WorldSizes, build_world
    from world.kb import build_kb
    from world.probe import probe_policy

    sizes = _parse_sets(args.set)
    if args.force:
        (args.out / MARKER_FILE).unlink(missing_ok=True)
    start = time.perf_counter()
    world = build_world(args.out, args.seed, progress=True, shipped=not args.no_shipped, **sizes)
    figures: dict[str, object] = {"seed": args.seed, "build_s": round(time.perf_counter() - start, 1)}
    figures.update({k: str(v) for k, v in vars(world).items()})
    if args.check:
        kb = build_kb(args.seed, WorldSizes(**sizes))
        figures["check"] = asyncio.run(probe_policy(world, kb, kb.test[: args.questions], seed=args.seed))
    if args.json:
        print(json.dumps(figures))
    else:
        from rich import print_json

        print_json(data=figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
