"""What asynchrony buys: the same short training run synchronously and asynchronously, each pool on its own core.

    python scripts/bench/bench_async.py                          # sync vs max_staleness 1, 2, 4; about 12 minutes here
    python scripts/bench/bench_async.py --staleness 2 --steps 12 --out runs/bench-async-quick
    python scripts/bench/bench_async.py --preset tiny-offpolicy --staleness 16,auto:1-16 --steps 40   # where staleness matters

Dedicated pools, as GPUs are: the generator pool (its vLLM engine) is pinned to one core and the learner to another
(`generators.cpu_cores`, `learner.cpu_cores`), so neither can borrow the other's core while it would idle. Every run
is `sr1 run <preset>` (`--preset`, default tiny) with the same data, model and steps; only `learner.max_staleness`
differs (`auto` in `--staleness`: the adaptive bound, `auto:1-16` from 1 to 16; `--correction` for every asynchronous run).

Printed in one run, for each setting: steps per minute (from the learner's per-step wall times, first `--warmup`
steps left out), its ratio to the synchronous run, the learner's busy fraction (time not spent waiting for a batch)
and the generator pool's (time with trajectories in its engine). From the synchronous run's phase times (generation
= the learner's wait for its batch, training = the rest of its step) comes the decoupling limit
(gen + train) / max(gen, train): what perfect overlap would give. Also `<out>/bench_async.json` and
`<out>/bench_async.png`. Exit status 1 when the best asynchronous ratio is under `--target`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sr1.sweep import ROOT, Case, bound_overrides, parse_bounds, run_case, save_figure  # noqa: E402

# A balanced configuration on two cores: generation of a step's 64 trajectories and the learner's update of them take
# about the same time, so neither phase hides the other (the synchronous run's phase times are printed to check).
BALANCED = [
    "eval.every_steps=0",
    "learner.checkpoint_every=1000",
    "learner.micro_batch_tokens=2048",
]


def phases(run_dir: Path, warmup: int) -> dict[str, float]:
    """Mean step, wait and train seconds per step, steps/min and idle fractions of one finished run."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "step" in r and "perf/step_s" in r][warmup:]
    if not steps:
        raise SystemExit(f"{run_dir}: no step after the first {warmup} (raise --steps)")
    step_s = statistics.fmean(r["perf/step_s"] for r in steps)
    wait_s = statistics.fmean(r.get("perf/wait_s", 0.0) for r in steps)
    report = json.loads((run_dir / "report.json").read_text())
    gen_idle = report.get("generator_idle_fraction")
    return {
        "steps": len(steps),
        "step_s": step_s,
        "wait_s": wait_s,
        "train_s": step_s - wait_s,
        "steps_per_min": 60.0 / step_s,
        "learner_busy": 1.0 - wait_s / step_s,
        "generator_busy": None if gen_idle is None else 1.0 - gen_idle,
        "em_before": report.get("em_before"),
        "em_after": report.get("em_after"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument(
        "--staleness",
        default="1,2,4",
        help="comma-separated asynchronous bounds to compare (`auto`: adaptive)",
    )
    parser.add_argument(
        "--preset", default="tiny", help="the preset every run starts from (tiny, tiny-offpolicy)"
    )
    parser.add_argument(
        "--correction",
        default=None,
        help="learner.correction of the asynchronous runs (default: the preset's)",
    )
    parser.add_argument("--steps", type=int, default=16, help="learner steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="first steps left out of the means")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cores", default=None, help="generator core,learner core (default: the first two allowed)"
    )
    parser.add_argument(
        "--target", type=float, default=1.3, help="the async/sync ratio the exit status checks"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where the runs go (default runs/bench-async, runs/bench-async-<preset> for another preset: finished "
        "runs there are reused)",
    )
    parser.add_argument("--set", nargs="*", default=[], help="extra overrides for every run")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = ROOT / "runs" / ("bench-async" if args.preset == "tiny" else f"bench-async-{args.preset}")
    allowed = sorted(os.sched_getaffinity(0))
    cores = [int(c) for c in args.cores.split(",")] if args.cores else allowed[:2]
    if len(cores) != 2 or cores[0] == cores[1] or not set(cores) <= set(allowed):
        parser.error(f"need two distinct cores this process may use ({allowed}), got {cores}")
    try:
        bounds = [b for b in parse_bounds(args.staleness) if b != 0]
    except ValueError as err:
        parser.error(f"--staleness: {err}")
    if not bounds:
        parser.error(
            "--staleness needs at least one asynchronous bound (the synchronous run is always measured)"
        )
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")
    pinned = [f"generators.cpu_cores=[{cores[0]}]", f"learner.cpu_cores=[{cores[1]}]"]
    extra = [f"learner.total_steps={args.steps}", *BALANCED, *pinned, *args.set]
    correction = [f"learner.correction={args.correction}"] if args.correction else []
    suffix = f", {args.correction}" if args.correction else ""
    settings = [Case("sync", "sync (max_staleness 0)", ["learner.max_staleness=0"])] + [
        Case(
            f"async{s}".replace(":", ""),
            f"async (max_staleness {s}{suffix})",
            [*bound_overrides(s), *correction],
        )
        for s in bounds
    ]
    measured: dict[str, dict] = {}
    for case in settings:
        print(f"{case.label} ...", flush=True)
        run_dir = run_case(case, args.seed, args.out, extra, preset=args.preset)
        measured[case.name] = phases(run_dir, args.warmup) | {"label": case.label}
    sync = measured["sync"]
    gen, train = sync["wait_s"], sync["train_s"]
    limit = (gen + train) / max(gen, train)
    print(
        f"\nsync phases per step: generation (learner waits) {gen:.2f} s, training {train:.2f} s; "
        f"decoupling limit (gen + train) / max(gen, train) = {limit:.2f}x"
    )
    print(
        "| setting | steps/min | ratio to sync | of the limit | learner busy | generator busy | test EM before -> after |"
    )
    print("|---|---|---|---|---|---|---|")
    for m in measured.values():
        m["ratio"] = m["steps_per_min"] / sync["steps_per_min"]
        print(
            f"| {m['label']} | {m['steps_per_min']:.1f} | {m['ratio']:.2f}x | {m['ratio'] / limit:.0%} "
            f"| {m['learner_busy']:.2f} | {_figure(m['generator_busy'])} | {_figure(m['em_before'])} -> {_figure(m['em_after'])} |"
        )
    best = max(m["ratio"] for k, m in measured.items() if k != "sync")
    conditions = {
        "cores": cores,
        "preset": args.preset,
        "seed": args.seed,
        "steps": args.steps,
        "warmup": args.warmup,
        "overrides": extra,
    }
    out = {"limit": limit, "gen_s": gen, "train_s": train, "runs": measured, "conditions": conditions}
    (args.out / "bench_async.json").write_text(json.dumps(out, indent=2))
    plot(measured, limit, args.out / "bench_async.png")
    print(
        f"\nbest async/sync {best:.2f}x (target {args.target}x); wrote {args.out}/bench_async.json and .png"
    )
    return 0 if best >= args.target else 1


def _figure(value: float | None) -> str:
    """Two decimals, or "-" for a figure the run did not report."""
    return "-" if value is None else f"{value:.2f}"


def plot(measured: dict[str, dict], limit: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(measured)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.bar(
        range(len(names)),
        [measured[n]["ratio"] for n in names],
        color=["tab:gray"] + ["tab:blue"] * (len(names) - 1),
    )
    ax.axhline(limit, color="tab:red", linestyle="--", label=f"decoupling limit {limit:.2f}x")
    ax.set_xticks(range(len(names)), [measured[n]["label"].replace(" (", "\n(") for n in names], fontsize=8)
    ax.set_ylabel("steps/min relative to sync")
    ax.set_title("generator and learner pools on one core each")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
