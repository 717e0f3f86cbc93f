"""Crash anything, lose nothing: SIGKILL parts of a real `sr1 run` and check what survived.

    python scripts/chaos/chaos.py                        # one run per part, each killed once mid-run (the default table)
    python scripts/chaos/chaos.py --sequence             # one run, every part killed in turn (what the CI test does)
    python scripts/chaos/chaos.py --parts learner,redis --steps 60 --checkpoint-every 20 --seed 3

Parts: generator, learner, redis, retrieval, parent (`sr1 run` itself, as when a terminal dies; the run is then
resumed with `sr1 run --resume DIR`). Each kill lands at a random step (`--seed` picks them).

Checked at the end of every run, from the files and the Redis AOF the run leaves behind:
- completed: the run reached its last step and exited 0;
- lost: released prompts neither trained in the surviving history nor still pending (must be 0);
- trained twice: groups trained twice in the surviving history (must be 0);
- versions: published versions never went back, and the surviving history's versions strictly increase;
- bound: the largest staleness of any loss token, against `learner.max_staleness`;
- orphans: processes of the run still alive after it ended (must be none).
The time to recover is printed per kill: until a new process of the killed part runs, and until the learner publishes
the next version.

Three other kinds of fault, each in one run checked the same way, live in their own modules:

    python scripts/chaos/chaos.py --checkpoint-faults      # a torn checkpoint, then a full disk (chaos_checkpoints.py)
    python scripts/chaos/chaos.py --faults                 # a poison prompt, a malformed group and evaluation request, a
                                                     # frozen retriever, under synchronous training (chaos_faults.py)
    python scripts/chaos/chaos.py --network                # network cuts (5, 20, 60 s) and a full Redis (chaos_network.py)
    python scripts/chaos/chaos.py --freeze                 # hangs: each part SIGSTOPped 5 s, past the lease, past the
                                                     # learner's collective timeout (chaos_freeze.py)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# the repository root, for sr1's packages and scripts.* (this file is run by path)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.chaos import chaos_checkpoints, chaos_faults, chaos_freeze, chaos_network  # noqa: E402
from scripts.chaos.base import (  # noqa: E402
    PARTS,
    ChaosRun,
    Recovery,
    Verdict,
    chosen,
    injection_steps,
    run_overrides,
    verify,
)


def run_chaos(
    run_dir: Path,
    parts: list[str],
    *,
    steps: int,
    checkpoint_every: int,
    max_staleness: int,
    seed: int,
    first_step: int = 2,
    spacing: int = 3,
    preset: str = "tiny",
) -> tuple[list[Recovery], Verdict]:
    """One run with `parts` killed in turn, one every `spacing` steps or so (each at a random one of two steps)."""
    kill_steps = injection_steps(len(parts), steps, seed, first_step, spacing)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    chaos = ChaosRun(run_dir, run_overrides(steps, checkpoint_every, max_staleness), preset=preset)
    recoveries, published = [], []
    try:
        for part, step in zip(parts, kill_steps, strict=True):
            recovery = chaos.kill(part, step)
            published.append(recovery.at_version)
            recoveries.append(recovery)
        returncode = chaos.finish()
    finally:
        chaos.kill_everything_left()
    return recoveries, verify(chaos, returncode, steps, max_staleness, published)


def table(rows: list[tuple[Recovery, Verdict]]) -> str:
    lines = [
        "| killed | at version | new process after (s) | next version after (s) | completed | lost | "
        "trained twice | versions only go up | max staleness (bound) | orphans |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for recovery, verdict in rows:
        lines.append(
            f"| {recovery.part} | {recovery.at_version} | {recovery.new_process_s:.1f} | "
            f"{recovery.next_version_s:.1f} | {'yes' if verdict.completed else 'NO'} | {verdict.lost} | "
            f"{verdict.trained_twice} | {'yes' if verdict.versions_increase else 'NO'} | "
            f"{verdict.max_staleness_seen} ({verdict.max_staleness}) | {len(verdict.orphans)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated parts to kill")
    parser.add_argument("--sequence", action="store_true", help="one run, the parts killed in turn")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="steps of the run (default 30; with --network 4 per injection plus 20: a full Redis or a long cut can "
        "take several versions to recover from, and every injection needs steps after it)",
    )
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7, help="picks the kill steps")
    parser.add_argument("--out", type=Path, default=Path("runs/chaos"), help="where the runs go")
    parser.add_argument(
        "--preset",
        default="tiny",
        help="the preset the kills and freezes run (tiny-lora: LoRA adapters to the engines)",
    )
    fault_kinds = {  # an option of chaos.py -> the module that runs that kind of fault instead of the kills
        "checkpoint_faults": chaos_checkpoints,
        "faults": chaos_faults,
        "network": chaos_network,
        "freeze": chaos_freeze,
    }
    for module in fault_kinds.values():
        module.add_arguments(parser)
    args = parser.parse_args(argv)
    for option, module in fault_kinds.items():
        if getattr(args, option) is not None:
            return module.chaos_main(args, parser)
    parts = chosen(args.parts, PARTS, "part", parser)
    steps = args.steps or 30
    stamp = time.strftime("%Y%m%d-%H%M%S")
    common = dict(
        steps=steps,
        checkpoint_every=args.checkpoint_every,
        max_staleness=args.max_staleness,
        preset=args.preset,
    )
    rows = []
    if args.sequence:
        recoveries, verdict = run_chaos(args.out / f"sequence-{stamp}", parts, seed=args.seed, **common)
        rows = [(r, verdict) for r in recoveries]
    else:
        middle = steps // 2  # each part dies mid-run, between two checkpoints when the interval allows
        for part in parts:
            print(f"killing the {part} (run {len(rows) + 1}/{len(parts)})", flush=True)
            recoveries, verdict = run_chaos(
                args.out / f"{part}-{stamp}", [part], seed=args.seed, first_step=middle - 1, **common
            )
            rows.append((recoveries[0], verdict))
    print(table(rows))
    return 0 if all(v.ok for _, v in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
