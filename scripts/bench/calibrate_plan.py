"""Calibrate `sr1 plan` on this CPU: real runs and the planner's predictions side by side, steps/min within ±15 %.

    python scripts/bench/calibrate_plan.py --recorded            # no runs: the planner against bench_async's recorded runs
    python scripts/bench/calibrate_plan.py                       # the engine benches and every case below, twice (~22 min)
    python scripts/bench/calibrate_plan.py --cases sync,async2 --steps 12 --repeats 1 --out runs/calibrate-quick

Each case is `sr1 run tiny` with the generator pool pinned to one core and the learner to another (as
scripts/bench/bench_async.py runs them: the planner models dedicated pools, not pools sharing cores):

- bench_async's four: sync (max_staleness 0) and async at max_staleness 1, 2, 4, 8 groups x 8 per step;
- three more `sr1 run` configurations: fewer groups per step (4, max_staleness 1), the default bound with 12 groups
  per step, and two engines sharing the generator core (synchronous).

Measured steps/min come from the learner's per-step wall times (the first `--warmup` steps left out), as
bench_async.py computes them; the generator's busy share over the same steps from its heartbeats (`pool/busy_s`).
Predicted ones come from `sr1 plan`'s simulator with a profile: `--profile` (default `cpu-tiny`, measured from
this harness's synchronous run of 2026-11-25) or, with `--fit-sync`, measured from this run's own synchronous case
(`sr1 plan --from-run`, the engine curve's shape from `bench_generators.py --curve` on the generator core), so that
every other case is a prediction. Engines sharing the generator core get the curve one engine measured while
`bench_generators.py --curve --engines 2` ran two there at once (`<out>/engine-curve-2.json`), relative to one alone
(`<out>/engine-curve-1.json`): both benches run before the cases, on the same core.

Everything runs `--repeats` times (default 2), pass after pass (the benches, then every case), so that a slow minute
of the machine does not fall on one case's every run; each pass predicts from its own benches and profile (with
`--fit-sync`, its own synchronous run), and a case's error compares the median of its predictions with the median of
its measured runs: on this machine the same pinned learner trains 10-20 % faster in one run than in another, and
one bench of two engines sharing the core can find a share of 0.35 where the next finds 0.45. Beside each
prediction, the case predicted again at the learner rate its own runs had (their `perf/tokens_per_s`): the error
left there is the model's, the rest is the machine's drift between the profile's run and the case's. Prints one
table (markdown; each run's figure in brackets) and writes `<out>/calibration.json`. Exit status 1 when a case
misses ±`--tolerance`.
Quiet machine needed: the runs pin one core each, and a busy machine makes them slower than any model of them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from config import load_config  # noqa: E402
from sr1.plan.measured import (  # noqa: E402
    learner_tokens_per_s,
    pool_busy_fraction,
    profile_from_run,
    read_bench_output,
    step_rows,
    with_engine_bench,
)
from sr1.plan.profile import (  # noqa: E402
    Curve,
    Profile,
    load_profile,
    validate_profile,
    with_engine_curve,
    with_figures,
)
from sr1.plan.simulate import simulate  # noqa: E402
from sr1.plan.splits import pipeline  # noqa: E402
from sr1.sweep import ROOT, Case  # noqa: E402


@dataclass(frozen=True)
class CalibrationCase:
    name: str
    label: str
    overrides: list[str]


CASES = [
    CalibrationCase("sync", "bench_async: sync (max_staleness 0)", ["learner.max_staleness=0"]),
    CalibrationCase("async1", "bench_async: max_staleness 1", ["learner.max_staleness=1"]),
    CalibrationCase("async2", "bench_async: max_staleness 2", ["learner.max_staleness=2"]),
    CalibrationCase("async4", "bench_async: max_staleness 4", ["learner.max_staleness=4"]),
    CalibrationCase(
        "g4s1",
        "sr1 run: 4 groups/step, max_staleness 1",
        ["learner.groups_per_step=4", "learner.max_staleness=1"],
    ),
    CalibrationCase(
        "g12s2",
        "sr1 run: 12 groups/step, max_staleness 2",
        ["learner.groups_per_step=12", "learner.max_staleness=2"],
    ),
    CalibrationCase(
        "e2s0",
        "sr1 run: 2 engines on the generator core, sync",
        ["generators.num_engines=2", "learner.max_staleness=0"],
    ),
]

# bench_async.py's recorded runs (docs/measurements/algorithms-tiny-world-2026-11-25.md, "What asynchrony buys":
# 2026-11-25, this project's 2-core VM, three fresh clones, seed 0, 16 steps of 64 trajectories, first 3 left out,
# generator pool on core 0, learner on core 1): rounds 1, 2, 3. Its generator busy figure covers the whole run,
# start-up included, not the measured steps, so it is not compared here.
RECORDED = {
    "sync": {"steps_per_min": (61.0, 63.3, 62.5), "learner_busy": (0.60, 0.61, 0.60)},
    "async1": {"steps_per_min": (101.8, 95.8, 88.8), "learner_busy": (0.98, 0.99, 0.97)},
    "async2": {"steps_per_min": (99.5, 100.7, 97.0), "learner_busy": (0.99, 0.99, 0.99)},
    "async4": {"steps_per_min": (104.9, 106.7, 95.9), "learner_busy": (0.99, 0.99, 0.99)},
}


def bench_path(out: Path, engines: int, n: int = 0) -> Path:
    """Where pass `n` (0-based) keeps its engine bench with `engines` engines on the core."""
    return out / f"engine-curve-{engines}{'' if n == 0 else f'-r{n + 1}'}.json"


def bench_engine(core: int, concurrencies: str, engines: int, seed: int, path: Path) -> Path:
    """`bench_generators.py --curve` pinned to `core` with `engines` engines at once, on the tiny world the runs use;
    its JSON at `path` (reused when there)."""
    if path.exists():
        return path
    world = ROOT / "runs" / ".world-cache" / f"seed{seed}"  # where `sr1 run tiny` keeps it
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "bench" / "bench_generators.py"),
        "--curve",
        concurrencies,
        "--json",
    ]
    cmd += ["--engines", str(engines), "--world", str(world), f"seed={seed}"]
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=str(core))
    done = subprocess.run(
        cmd, env=env, capture_output=True, text=True, preexec_fn=lambda: os.sched_setaffinity(0, {core})
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(done.stdout.strip().splitlines()[-1] + "\n")
    return path


def shared_core(profile: Profile, solo: Path, shared: Path, engines: int) -> Profile:
    """The profile for one of `engines` engines on one core. Its curve is scaled at each concurrency by what one
    engine measured while sharing the core (`shared`) over what it measured alone (`solo`); without the benches, each
    gets 1/engines of the core (an assumption). Every other second the generator core spends — a search's round
    trip as the worker sees it, receiving a publish, the hand-off — is divided by the same share (the median ratio):
    an engine's processes seem to take their share of the core whether or not it has work (docs/plan.md,
    "Calibration", gives the runs' figures)."""
    points = profile.generator.tokens_per_s.points
    if solo.exists() and shared.exists():
        command = "bench_generators.py --curve 4,8,16,32,64,128 --json"
        curves = [
            Curve(points=read_bench_output(f, command, "engine_curve")["engine_curve"], source=str(f))
            for f in (solo, shared)
        ]
        ratios = [curves[1].at(x) / curves[0].at(x) for x, _ in points]
    else:
        ratios = [1 / engines] * len(points)
    share = statistics.median(ratios)
    profile = with_engine_curve(profile, [(x, y * r) for (x, y), r in zip(points, ratios, strict=True)])
    slower = {
        "workload.search_latency_s": profile.workload.search_latency_s.value / share,
        "weight_sync_s": profile.weight_sync_s.value / share,
        "handoff_s": profile.handoff_s.value / share,
    }
    return with_figures(
        profile, slower, f"the profile's figure over {share:.2f}, the engine's share of the core"
    )


def predict(
    case: CalibrationCase, profile: Profile, steps: int, warmup: int, extra: list[str], out: Path, n: int = 0
) -> dict:
    """The planner's figures for one case: its config's pipeline, one generator core and one learner core (engines
    sharing the core from pass `n`'s benches in `out`)."""
    cfg = load_config("tiny", [*extra, *case.overrides])
    engines = cfg.generators.num_engines
    if engines > 1:  # engines sharing one core
        solo, shared = (bench_path(out, k, n) for k in (1, engines))
        profile = shared_core(profile, solo, shared, engines)
    pipe = pipeline(
        cfg, engines=engines, ranks=cfg.learner.num_ranks, max_staleness=cfg.learner.max_staleness
    )
    result = simulate(pipe, profile, steps=steps, warmup=warmup)
    return {
        "steps_per_min": result.steps_per_hour / 60,
        "learner_busy": result.learner_busy,
        "generator_busy": result.generator_busy,
        "staleness_mean": result.staleness_mean,
    }


def measure(case: CalibrationCase, args, extra: list[str], name: str) -> tuple[dict, Path]:
    """Run the case for real (`sr1 run tiny`, pools pinned, run directory `<out>/<name>-s<seed>`) and read its
    steps/min as bench_async.py does."""
    from scripts.bench.bench_async import phases
    from sr1.sweep import run_case

    run_dir = run_case(Case(name, case.label, case.overrides), args.seed, args.out, extra)
    measured = phases(run_dir, args.warmup)
    # the generator's busy share over the same steps as the rest (bench_async's figure covers the whole run, start-up
    # included): the heartbeats' cumulative busy and up seconds between the first and the last measured step
    steps = step_rows(run_dir)[args.warmup :]
    measured["generator_busy"] = pool_busy_fraction(steps, run_dir / "metrics.jsonl")
    # the learner's own speed over the same steps (what `sr1 plan --from-run` takes as the learner's figure)
    ranks = load_config(run_dir / "config.yaml").learner.num_ranks
    measured["learner_tokens_per_s"] = learner_tokens_per_s(steps, run_dir / "metrics.jsonl", ranks)
    return measured, run_dir


def medians(runs: list[dict]) -> dict:
    """Each figure's median over `runs` (dicts of figures), with every run's value under "runs" when there are
    several; a figure some run lacks is left out."""
    keys = [k for k, v in runs[0].items() if isinstance(v, int | float) and all(k in r for r in runs)]
    out: dict = {k: statistics.median(r[k] for r in runs) for k in keys}
    if len(runs) > 1:
        out["runs"] = {k: [r[k] for r in runs] for k in keys}
    return out


def _shown(figures: dict, key: str, fmt: str) -> str:
    """A figure, with each run's value in brackets when there are several."""
    value = "-" if figures.get(key) is None else format(figures[key], fmt)
    runs = figures.get("runs", {})
    return value + (f" ({' / '.join(format(r, fmt) for r in runs[key])})" if key in runs else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument(
        "--recorded", action="store_true", help="compare with bench_async's recorded runs only"
    )
    parser.add_argument("--cases", default=",".join(c.name for c in CASES), help="comma-separated case names")
    parser.add_argument("--steps", type=int, default=16, help="learner steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="first steps left out of the means")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cores", default="0,1", help="generator core,learner core")
    parser.add_argument("--profile", default="cpu-tiny", help="the planner's profile (name or file)")
    parser.add_argument(
        "--fit-sync", action="store_true", help="measure the profile from this run's sync case"
    )
    parser.add_argument(
        "--engine-curve",
        default="4,8,16,32,64,128",
        help="concurrencies bench_generators.py --curve measures on the generator core",
    )
    parser.add_argument(
        "--repeats", type=int, default=2, help="runs of each case, pass after pass; medians are compared"
    )
    parser.add_argument("--tolerance", type=float, default=0.15, help="largest relative error that passes")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "calibrate-plan")
    args = parser.parse_args(argv)
    by_name = {c.name: c for c in CASES}
    unknown = [n for n in args.cases.split(",") if n not in by_name]
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {', '.join(by_name)}")
    cases = [by_name[n] for n in args.cases.split(",")]
    if args.recorded:
        cases = [c for c in cases if c.name in RECORDED]
    if args.fit_sync and (args.recorded or cases[0].name != "sync"):
        parser.error("--fit-sync needs real runs with the sync case first")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    gen_core, learner_core = (int(c) for c in args.cores.split(","))
    # bench_async.py's balanced layout: no evaluations or checkpoints inside the timed steps
    from scripts.bench.bench_async import BALANCED

    extra = [
        f"learner.total_steps={args.steps}",
        *BALANCED,
        f"generators.cpu_cores=[{gen_core}]",
        f"learner.cpu_cores=[{learner_core}]",
    ]
    profile = load_profile(args.profile)
    sharing = {load_config("tiny", [*extra, *c.overrides]).generators.num_engines for c in cases} - {1}
    passes = 1 if args.recorded else args.repeats
    runs: dict[str, list[tuple[dict, dict]]] = {c.name: [] for c in cases}  # (measured, predicted) per pass
    profiles = []
    for n in range(passes):
        fitted = profile
        if not args.recorded:  # the engine's curve on the generator core: alone, and beside other engines
            print(
                f"bench_generators.py --curve on the generator core (pass {n + 1} of {passes}) ...",
                flush=True,
            )
            solo = bench_engine(gen_core, args.engine_curve, 1, args.seed, bench_path(args.out, 1, n))
            for engines in sorted(sharing):
                bench_engine(
                    gen_core, args.engine_curve, engines, args.seed, bench_path(args.out, engines, n)
                )
            if args.fit_sync:  # its shape; the sync run fits the scale
                fitted = validate_profile(
                    with_engine_bench(json.loads(profile.model_dump_json()), solo),
                    f"{profile.name} with {solo}",
                )
        shape = fitted
        for case in cases:
            if args.recorded:
                measured = {k: sum(values) / len(values) for k, values in RECORDED[case.name].items()}
                measured["runs"] = RECORDED[case.name]
            else:
                name = case.name if passes == 1 else f"{case.name}-r{n + 1}"
                print(f"{case.label} (pass {n + 1} of {passes}) ...", flush=True)
                measured, run_dir = measure(case, args, extra, name)
                if args.fit_sync and case.name == "sync":
                    fitted = profile_from_run(run_dir, shape)
            predicted = predict(case, fitted, args.steps, args.warmup, extra, args.out, n)
            predicted["learner_tokens_per_s"] = fitted.learner.tokens_per_s_per_rank.value
            if "learner_tokens_per_s" in measured:
                # the same prediction with the learner as fast as it ran in this run: what is left of the error is
                # the model's, not the machine's drift between the profile's run and this one
                at_rate = with_figures(
                    fitted,
                    {"learner.tokens_per_s_per_rank": measured["learner_tokens_per_s"]},
                    f"{run_dir}: its own learner's perf/tokens_per_s",
                )
                given = predict(case, at_rate, args.steps, args.warmup, extra, args.out, n)
                predicted["at_run_learner_steps_per_min"] = given["steps_per_min"]
            runs[case.name].append((measured, predicted))
        profiles.append(fitted)
    rows = []
    for case in cases:
        if args.recorded:
            ((measured, predicted),) = runs[case.name]
        else:
            measured = medians([m for m, _ in runs[case.name]])
            predicted = medians([p for _, p in runs[case.name]])
        error = predicted["steps_per_min"] / measured["steps_per_min"] - 1
        at_rate = predicted.get("at_run_learner_steps_per_min")
        rows.append(
            {
                "case": case.name,
                "label": case.label,
                "measured": measured,
                "predicted": predicted,
                "error": error,
                "within": abs(error) <= args.tolerance,
                "error_at_run_learner": None if at_rate is None else at_rate / measured["steps_per_min"] - 1,
            }
        )
    for n, fitted in enumerate(profiles):
        print(f"\nprofile{f' (pass {n + 1})' if passes > 1 else ''}: {fitted.name}")
    print(
        f"| case | steps/min measured | predicted | error | within ±{args.tolerance:.0%} "
        "| learner busy measured / predicted | generator busy measured / predicted "
        "| learner tokens/s: the run / the profile | predicted at the run's learner rate (error) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        m, p = row["measured"], row["predicted"]
        at_rate = row["error_at_run_learner"]
        print(
            f"| {row['label']} | {_shown(m, 'steps_per_min', '.1f')} | {_shown(p, 'steps_per_min', '.1f')} "
            f"| {row['error']:+.0%} | {'yes' if row['within'] else 'NO'} "
            f"| {_shown(m, 'learner_busy', '.2f')} / {_shown(p, 'learner_busy', '.2f')} "
            f"| {_shown(m, 'generator_busy', '.2f')} / {_shown(p, 'generator_busy', '.2f')} "
            f"| {_shown(m, 'learner_tokens_per_s', '.0f')} / {_shown(p, 'learner_tokens_per_s', '.0f')} "
            f"| {'-' if at_rate is None else _shown(p, 'at_run_learner_steps_per_min', '.1f') + f' ({at_rate:+.0%})'} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    conditions = {
        "recorded": args.recorded,
        "steps": args.steps,
        "warmup": args.warmup,
        "seed": args.seed,
        "repeats": passes,
        "overrides": extra,
    }
    out = {
        "rows": rows,
        "profiles": [json.loads(p.model_dump_json()) for p in profiles],
        "conditions": conditions,
    }
    (args.out / "calibration.json").write_text(json.dumps(out, indent=2, default=str))
    print(f"\nwrote {args.out}/calibration.json")
    return 0 if all(r["within"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
