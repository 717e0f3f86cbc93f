"""The tiny world build's child process: `python -m world --out DIR --seed N [--sizes JSON] [--quiet]`.

`build_world` starts it with the math libraries pinned (`world.PINNED_ENV`) so that a seed builds the same world
on every machine; run it by hand only with that environment (it refuses otherwise).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from world import PINNED_ENV, build_world, pinned


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m world", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sizes", default="{}", help="WorldSizes fields as a JSON object")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if not pinned():
        missing = " ".join(f"{k}={v}" for k, v in PINNED_ENV.items())
        print(
            f"python -m world: run with the pinned environment ({missing}), or call build_world()",
            file=sys.stderr,
        )
        return 2
    import torch

    torch.use_deterministic_algorithms(True)
    build_world(args.out, args.seed, progress=not args.quiet, **json.loads(args.sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
