"""The tiny world build's child process: `python -m world --out DIR --seed N [--sizes JSON] [--quiet]`.

`build_world` starts it with the math libraries pinned (`world.PINNED_ENV`) so that a seed builds the same world
on every machine; run it by hand only with that environment (it refuses otherwise).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common.progress import PhaseProgress
from world import PINNED_ENV, build_world, pinned


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m world", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sizes", default="{}", help="WorldSizes fields as a JSON object")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument(
        "--no-shipped",
        action="store_true",
        help="start from a random init even where the shipped policy would do",
    )
    parser.add_argument(
        "--since",
        type=float,
        help="when the build was asked for (time.time()): the time it reports counts from there",
    )
    args = parser.parse_args(argv)
    if not pinned():
        missing = " ".join(f"{k}={v}" for k, v in PINNED_ENV.items())
        print(
            f"python -m world: run with the pinned environment ({missing}), or call build_world()",
            file=sys.stderr,
        )
        return 2
    progress = not args.quiet
    # torch takes seconds to import on a busy machine: say so, so the build is never silent for long
    with PhaseProgress(
        "tiny world: loading torch", expected_s=5, enabled=progress, report_done=False, announce=True
    ):
        import torch
        import transformers

        transformers.logging.disable_progress_bar()  # its per-file bars would interleave with the world's lines
    torch.use_deterministic_algorithms(True)
    # the parent found no shipped copy of this world to install (or was told not to use one): this builds it, from
    # the shipped seed-0 policy where `build_world` may start there
    build_world(
        args.out,
        args.seed,
        progress=progress,
        since=args.since,
        shipped=not args.no_shipped,
        **json.loads(args.sizes),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
