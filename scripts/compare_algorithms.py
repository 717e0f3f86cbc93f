"""Compare the RL methods on the tiny world: each trained by `sr1 run` on several seeds for the same number of steps.

    python scripts/compare_algorithms.py                           # 6 methods x 3 seeds: about an hour on 2 CPU cores
    python scripts/compare_algorithms.py --methods grpo,ppo --seeds 0 --out runs/compare-quick
    python scripts/compare_algorithms.py --report-only --out runs/compare   # the table and plot of finished runs

Every run is `sr1 run tiny seed=<s> <the method's overrides> <--set overrides>` in `<out>/<method>-s<seed>/`; a run
whose report.json exists is not run again, so an interrupted comparison continues where it stopped. The methods keep
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
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# name -> (label, `sr1 run` overrides)
METHODS: dict[str, tuple[str, list[str]]] = {
    "grpo": ("GRPO", []),
    "drgrpo": ("Dr. GRPO", ["learner.algorithm.type=drgrpo"]),
    "rloo": ("RLOO", ["learner.algorithm.type=rloo"]),
    "reinforce_pp": ("REINFORCE++", ["learner.algorithm.type=reinforce_pp"]),
    "ppo": (
        "PPO (critic)",
        [
            "learner.algorithm.type=ppo",
            "learner.algorithm.critic.lr=1e-3",
            "generators.group_size=1",  # one sample per prompt, as Search-R1's PPO ...
            "learner.groups_per_step=64",  # ... and the same 64 trajectories per step as the others
            "generators.max_inflight_groups=128",  # the same trajectories in flight per engine (16 groups x 8)
        ],
    ),
    "grpo_ds": ("GRPO + dynamic sampling", ["learner.algorithm.dynamic_sampling=true"]),
}
COMMON = ["eval.every_steps=10"]  # an EM curve point every 10 steps


def run_one(method: str, seed: int, out: Path, extra: list[str], log_dir: Path) -> Path:
    """`sr1 run` for one method and seed (skipped when its report exists); returns its run directory."""
    run_dir = out / f"{method}-s{seed}"
    if (run_dir / "report.json").is_file():
        return run_dir
    overrides = [f"seed={seed}", *COMMON, *METHODS[method][1], *extra]
    cmd = [sys.executable, "-m", "sr1", "run", "tiny", *overrides, "--run-dir", str(run_dir), "--no-live"]
    with open(log_dir / f"{method}-s{seed}.log", "w") as log:
        done = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} exited {done.returncode}; see {log_dir / f'{method}-s{seed}.log'}"
        )
    return run_dir


def read_run(run_dir: Path) -> dict:
    """What the table and the plot need from one finished run (its report.json)."""
    report = json.loads((run_dir / "report.json").read_text())
    curve = sorted((int(e["step"]), float(e["eval/em"])) for e in report["evals"] if "eval/em" in e)
    return {
        "em_before": report["em_before"],
        "em_after": report["em_after"],
        "step_s": report["step_s_mean"],
        "idle": report["learner_idle_fraction"],
        "curve": curve,
    }


def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f}"


def summarize(results: dict[str, dict[int, dict]]) -> tuple[str, bool]:
    """The markdown table, and whether every method lifted EM on every seed."""
    lines = [
        "| method | EM before | EM after | lift per seed | lifted on every seed | s / step | learner idle |",
        "|---|---|---|---|---|---|---|",
    ]
    all_lift = True
    for method, by_seed in results.items():
        runs = [by_seed[s] for s in sorted(by_seed)]
        lifts = [r["em_after"] - r["em_before"] for r in runs]
        lifted = all(x > 0 for x in lifts)
        all_lift &= lifted
        lines.append(
            f"| {METHODS[method][0]} | {_mean_std([r['em_before'] for r in runs])} "
            f"| {_mean_std([r['em_after'] for r in runs])} | {', '.join(f'{x:+.2f}' for x in lifts)} "
            f"| {'yes' if lifted else 'no'} | {_mean_std([r['step_s'] for r in runs])} "
            f"| {_mean_std([r['idle'] for r in runs])} |"
        )
    return "\n".join(lines), all_lift


def write_atomic(path: Path, text: str) -> None:
    """Write through a temporary file and rename, so a reader never sees half a table."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def plot(results: dict[str, dict[int, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (method, by_seed) in enumerate(results.items()):
        color = f"C{i}"
        curves = [dict(r["curve"]) for r in by_seed.values()]
        for curve in curves:
            ax.plot(list(curve), list(curve.values()), color=color, alpha=0.25, linewidth=0.8)
        steps = sorted(set.intersection(*(set(c) for c in curves)))
        mean = [statistics.fmean(c[s] for c in curves) for s in steps]
        ax.plot(steps, mean, color=color, linewidth=2, marker="o", markersize=3, label=METHODS[method][0])
    ax.set_xlabel("learner step (policy version)")
    ax.set_ylabel("greedy test EM")
    ax.set_title(f"tiny world, mean over {len(next(iter(results.values())))} seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument(
        "--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}"
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
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown methods {unknown}; known: {', '.join(METHODS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    out = args.out
    log_dir = out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[int, dict]] = {m: {} for m in methods}
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn())  # fmt: skip
    with Progress(*columns) as progress:
        task = progress.add_task("runs", total=len(methods) * len(seeds))
        for seed in seeds:  # seed-major: a partial comparison already covers every method
            for method in methods:
                progress.update(task, description=f"{method} seed {seed}")
                start = time.monotonic()
                if args.report_only:
                    run_dir = out / f"{method}-s{seed}"
                    if not (run_dir / "report.json").is_file():
                        progress.advance(task)
                        continue
                else:
                    run_dir = run_one(method, seed, out, args.set, log_dir)
                results[method][seed] = read_run(run_dir)
                progress.console.print(
                    f"{method} seed {seed}: EM {results[method][seed]['em_before']:.2f} -> "
                    f"{results[method][seed]['em_after']:.2f} ({time.monotonic() - start:.0f} s)"
                )
                progress.advance(task)
    results = {m: r for m, r in results.items() if r}
    if not results:
        print("no finished runs", file=sys.stderr)
        return 1
    table, all_lift = summarize(results)
    conditions = (
        f"tiny preset, seeds {','.join(map(str, seeds))}, overrides {COMMON + args.set}; "
        f"{sys.executable} -m sr1 run tiny ... per run"
    )
    write_atomic(out / "table.md", table + "\n\n" + conditions + "\n")
    write_atomic(out / "results.json", json.dumps(results, indent=2))
    plot(results, out / "em_curves.png")
    print(table)
    print(f"\n{conditions}\nwrote {out / 'table.md'}, {out / 'results.json'}, {out / 'em_curves.png'}")
    if not all_lift:
        print("some method did not lift EM on every seed", file=sys.stderr)
    return 0 if all_lift else 1


if __name__ == "__main__":
    sys.exit(main())
