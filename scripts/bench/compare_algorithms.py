"""Compare the RL methods on the tiny world: each trained by `sr1 run` on several seeds for the same number of steps.

    python scripts/bench/compare_algorithms.py                           # 6 methods x 3 seeds: about an hour on 2 CPU cores
    python scripts/bench/compare_algorithms.py --methods grpo,ppo --seeds 0 --out runs/compare-quick
    python scripts/bench/compare_algorithms.py --report-only --out runs/compare   # the table and plot of finished runs

Every run is `sr1 run tiny seed=<s> <the method's overrides> <--set overrides>` in `<out>/<method>-s<seed>/`, run by
sr1/sweep.py: a run whose report.json exists is not run again, so an interrupted comparison continues where it stopped. The methods keep
the tiny preset's steps, learning rate and trajectories per step (8 groups x 8 samples; PPO, which needs no group,
gets 64 groups of 1). Then `<out>/table.md` (greedy test EM before -> after, mean +- sample std over seeds, time per
step, learner idle fraction), `<out>/results.json` and `<out>/em_curves.png` (EM against steps, one line per method,
averaged over seeds, thin lines per seed). The exit status is 1 if a method failed to lift EM on some seed.
A benchmark script, not a test: the CI runs every method for a few steps in tests/integration/test_learner_algorithms.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sr1.sweep import ROOT, Case, mean_std, run_sweep, save_figure  # noqa: E402

METHODS = [
    Case("grpo", "GRPO"),
    Case("drgrpo", "Dr. GRPO", ["learner.algorithm.type=drgrpo"]),
    Case("rloo", "RLOO", ["learner.algorithm.type=rloo"]),
    Case("reinforce_pp", "REINFORCE++", ["learner.algorithm.type=reinforce_pp"]),
    Case(
        "ppo",
        "PPO (critic)",
        [
            "learner.algorithm.type=ppo",
            "learner.algorithm.critic.lr=1e-3",
            "generators.group_size=1",  # one sample per prompt, as Search-R1's PPO ...
            "learner.groups_per_step=64",  # ... and the same 64 trajectories per step as the others
            "generators.max_inflight_groups=128",  # the same trajectories in flight per engine (16 groups x 8)
        ],
    ),
    Case("grpo_ds", "GRPO + dynamic sampling", ["learner.algorithm.dynamic_sampling=true"]),
]
BY_NAME = {case.name: case for case in METHODS}
COMMON = ["eval.every_steps=10"]  # an EM curve point every 10 steps


def summarize(results: dict[str, dict[int, dict]]) -> tuple[str, bool]:
    """The markdown table, and whether every method lifted EM on every seed."""
    lines = [
        "| method | EM before | EM after | lift per seed | lifted on every seed | s / step | learner idle |",
        "|---|---|---|---|---|---|---|",
    ]
    all_lift = True
    for name, by_seed in results.items():
        runs = [by_seed[s] for s in sorted(by_seed)]
        lifts = [r["em_after"] - r["em_before"] for r in runs]
        lifted = all(x > 0 for x in lifts)
        all_lift &= lifted
        lines.append(
            f"| {BY_NAME[name].label} | {mean_std([r['em_before'] for r in runs])} "
            f"| {mean_std([r['em_after'] for r in runs])} | {', '.join(f'{x:+.2f}' for x in lifts)} "
            f"| {'yes' if lifted else 'no'} | {mean_std([r['step_s'] for r in runs])} "
            f"| {mean_std([r['learner_idle'] for r in runs])} |"
        )
    return "\n".join(lines), all_lift


def plot(results: dict[str, dict[int, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, by_seed) in enumerate(results.items()):
        color = f"C{i}"
        curves = [dict(r["curve"]) for r in by_seed.values()]
        for curve in curves:
            ax.plot(list(curve), list(curve.values()), color=color, alpha=0.25, linewidth=0.8)
        steps = sorted(set.intersection(*(set(c) for c in curves)))
        mean = [statistics.fmean(c[s] for c in curves) for s in steps]
        ax.plot(steps, mean, color=color, linewidth=2, marker="o", markersize=3, label=BY_NAME[name].label)
    ax.set_xlabel("learner step (policy version)")
    ax.set_ylabel("greedy test EM")
    ax.set_title(f"tiny world, mean over {len(next(iter(results.values())))} seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument(
        "--methods", default=",".join(BY_NAME), help=f"comma-separated, of {', '.join(BY_NAME)}"
    )
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "compare-algorithms")
    parser.add_argument(
        "--set", nargs="*", default=[], help="overrides for every run, e.g. learner.total_steps=20"
    )
    parser.add_argument(
        "--report-only", action="store_true", help="only build the table and plot of finished runs"
    )
    args = parser.parse_args(argv)
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in names if m not in BY_NAME]
    if unknown:
        parser.error(f"unknown methods {unknown}; known: {', '.join(BY_NAME)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    extra = [*COMMON, *args.set]
    results = run_sweep([BY_NAME[m] for m in names], seeds, args.out, extra, report_only=args.report_only)
    if not results:
        print("no finished runs", file=sys.stderr)
        return 1
    table, all_lift = summarize(results)
    conditions = (
        f"tiny preset, seeds {','.join(map(str, seeds))}, overrides {extra}; `sr1 run tiny ...` per run"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(table + "\n\n" + conditions + "\n")
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    plot(results, args.out / "em_curves.png")
    print(table)
    print(
        f"\n{conditions}\nwrote {args.out / 'table.md'}, {args.out / 'results.json'}, {args.out / 'em_curves.png'}"
    )
    if not all_lift:
        print("some method did not lift EM on every seed", file=sys.stderr)
    return 0 if all_lift else 1


if __name__ == "__main__":
    sys.exit(main())
