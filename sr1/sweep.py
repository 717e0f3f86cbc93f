"""Sweeps of `sr1 run`: one preset under several settings and seeds, each run in a directory of its own.

    cases = [Case("s0", "max_staleness 0", ["learner.max_staleness=0"]), Case("s2", "max_staleness 2", [...])]
    results = run_sweep(cases, seeds=[0, 1, 2], out=Path("runs/sweep"))    # {case name: {seed: read_run(...)}}

Every run is `sr1 run <preset> seed=<s> <the case's overrides> <extra overrides>` in `<out>/<case>-s<seed>/`, its
output in `<out>/logs/`. A run whose `report.json` exists is not run again, so an interrupted sweep continues where it
stopped (a run cut off before its report starts again from scratch; delete a run's directory to run it again).
`scripts/bench/compare_algorithms.py` and `scripts/bench/compare_staleness.py` are sweeps; `read_run` is what they tabulate
and plot.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sr1.report import offpolicy_curve

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Case:
    name: str  # directory-safe: `<out>/<name>-s<seed>/`
    label: str  # for tables and legends
    overrides: list[str] = field(default_factory=list)


class RunFailed(RuntimeError):
    """A run of the sweep exited with an error; the message names its command and log."""


def run_case(
    case: Case,
    seed: int,
    out: Path,
    extra: Sequence[str] = (),
    preset: str = "tiny",
    prefix: Sequence[str] = (),
) -> Path:
    """`sr1 run` for one case and seed (skipped when its report exists); returns its run directory. `prefix` goes
    before the command (e.g. `taskset -c 0,1`)."""
    run_dir = out / f"{case.name}-s{seed}"
    if (run_dir / "report.json").is_file():
        return run_dir
    if run_dir.exists():  # interrupted: its evaluations and metrics would mix with a new run's
        shutil.rmtree(run_dir)
    log_path = out / "logs" / f"{case.name}-s{seed}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    overrides = [f"seed={seed}", *case.overrides, *extra]
    cmd = [
        *prefix,
        sys.executable,
        "-m",
        "sr1",
        "run",
        preset,
        *overrides,
        "--run-dir",
        str(run_dir),
        "--no-live",
    ]
    with open(log_path, "w") as log:
        done = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0 or not (run_dir / "report.json").is_file():
        raise RunFailed(f"{' '.join(cmd)} exited {done.returncode}; see {log_path}")
    return run_dir


def read_run(run_dir: Path) -> dict[str, Any]:
    """What sweeps tabulate of one finished run: EM before and after, the EM curve against steps and against wall
    seconds since the first evaluation, time per step, idle fractions, the staleness histogram and the off-policy
    diagnostics of every step (`offpolicy`: step, mismatch_kl, is_ess, clipped_frac, masked_frac, bound, ...)."""
    report = json.loads((run_dir / "report.json").read_text())
    curve = sorted((int(e["step"]), float(e["eval/em"])) for e in report["evals"] if "eval/em" in e)
    timed = []  # (seconds since the evaluation before training, EM), from the evaluation rows of metrics.jsonl
    steps = []
    metrics = run_dir / "metrics.jsonl"
    for line in metrics.read_text().splitlines() if metrics.is_file() else []:
        row = json.loads(line)
        if "eval_step" in row and "eval/em" in row:
            timed.append((float(row["time"]), float(row["eval/em"])))
        elif "step" in row:
            steps.append(row)
    timed.sort()
    t0 = timed[0][0] if timed else 0.0
    return {
        "em_before": report["em_before"],
        "em_after": report["em_after"],
        "step_s": report["step_s_mean"],
        "wall_s": report["wall_s"],
        "learner_idle": report["learner_idle_fraction"],
        "generator_idle": report["generator_idle_fraction"],
        "curve": curve,
        "curve_wall": [(t - t0, em) for t, em in timed],
        "staleness_histogram": {int(k): int(v) for k, v in report.get("staleness_histogram", {}).items()},
        "offpolicy": offpolicy_curve(steps),
    }


def run_sweep(
    cases: Sequence[Case],
    seeds: Sequence[int],
    out: Path,
    extra: Sequence[str] = (),
    *,
    preset: str = "tiny",
    prefix: Sequence[str] = (),
    report_only: bool = False,
) -> dict[str, dict[int, dict[str, Any]]]:
    """Every case on every seed, seed-major (a partial sweep already covers every case), with a progress bar.
    `report_only`: read the finished runs, start none."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    results: dict[str, dict[int, dict[str, Any]]] = {c.name: {} for c in cases}
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns) as progress:
        task = progress.add_task("runs", total=len(cases) * len(seeds))
        for seed in seeds:
            for case in cases:
                progress.update(task, description=f"{case.label}, seed {seed}")
                start = time.monotonic()
                run_dir = out / f"{case.name}-s{seed}"
                if not report_only:
                    run_dir = run_case(case, seed, out, extra, preset, prefix)
                if (run_dir / "report.json").is_file():
                    result = results[case.name][seed] = read_run(run_dir)
                    progress.console.print(
                        f"{case.label}, seed {seed}: EM {result['em_before']:.2f} -> {result['em_after']:.2f} "
                        f"({time.monotonic() - start:.0f} s)"
                    )
                progress.advance(task)
    return {name: by_seed for name, by_seed in results.items() if by_seed}


def mean_std(values: Sequence[float], digits: int = 2) -> str:
    """`mean ± sample std` (one value: the value)."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def save_figure(fig: Any, path: Path) -> None:
    """Write a matplotlib figure atomically (a temporary file renamed)."""
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.replace(path)


_AUTO_RANGE = re.compile(r"auto:(?P<floor>\d+)-(?P<ceiling>\d+)")


def parse_bounds(text: str) -> list[int | str]:
    """`0,8,auto,auto:1-16` -> [0, 8, "auto", "auto:1-16"] (`auto:F-C`: the adaptive bound between floor F and
    ceiling C); raises ValueError on anything else (a negative bound, a floor over the ceiling included)."""
    bounds: list[int | str] = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        if item == "auto":
            bounds.append(item)
            continue
        if match := _AUTO_RANGE.fullmatch(item):
            if int(match["floor"]) > int(match["ceiling"]):
                raise ValueError(f"auto's floor must be <= its ceiling, got {item!r}")
            bounds.append(item)
            continue
        try:
            bound = int(item)
        except ValueError:
            raise ValueError(
                f"a bound is an integer >= 0 or auto, got {item!r} (auto:FLOOR-CEILING: auto within a range)"
            ) from None
        if bound < 0:
            raise ValueError(f"a bound must be >= 0, got {bound}")
        bounds.append(bound)
    return bounds


def bound_overrides(bound: int | str) -> list[str]:
    """The overrides that set one of `parse_bounds`' bounds: `learner.max_staleness`, and auto's range."""
    match = _AUTO_RANGE.fullmatch(str(bound))
    if match is None:
        return [f"learner.max_staleness={bound}"]
    return [
        "learner.max_staleness=auto",
        f"learner.max_staleness.auto.floor={match['floor']}",
        f"learner.max_staleness.auto.ceiling={match['ceiling']}",
    ]
