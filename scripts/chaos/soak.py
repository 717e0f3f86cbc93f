"""Soak: run `sr1 run` for a given time and check that no process's memory, file descriptors or threads, nor Redis's
memory or key count, keep growing.

    python scripts/chaos/soak.py                                   # 1 hour of the tiny preset, into runs/soak-<time>/
    python scripts/chaos/soak.py --duration 600 --warmup 240 --window 120 --out runs/soak-short
    python scripts/chaos/soak.py --duration 7200 -- learner.max_staleness=0     # overrides after `--` go to `sr1 run`

It starts `sr1 run <preset>` as `make run` does, with `learner.total_steps` large enough never to be reached, and
stops it with SIGTERM after `--duration` seconds (the clock starts when `sr1 run` is launched, so the warm-up covers
the start-up too). The run must stop cleanly (exit 130, the learner checkpoints first) and leave no process behind.

Every `--interval` seconds (30) it samples every process of the run, found as the process tree of `sr1 run` (the
launcher, Redis, the retrieval server and its workers, the generator workers and their vLLM engine processes, the
learner ranks): resident memory (RSS), open file descriptors and threads; and Redis's `used_memory` and key count
(DBSIZE).

The verdict (growth): for each series, a Theil-Sen line is fitted through the samples after `--warmup` (600 s): the
median of the slopes between every two samples. Its rise from the first of them to the last, against its value at the
first, is the growth. A series fails when it grew by more than `--bound` (5 %) *and* by more than the metric's
absolute floor (`FLOOR`: 2 file descriptors, threads or keys: counts that small move with ordinary churn; memory has
none). A robust line, not window medians or a least-squares fit: bursts (a checkpoint, an evaluation), a server whose
descriptors swing with its connections and a process sampled sometimes mid-step and sometimes between steps (one
that gives freed memory back after each step) do not tilt it; memory or descriptors that are kept do. A series must
span `--window` seconds (300) after the warm-up to be judged. A process of the run that exits or is restarted during
the measured span fails the soak too.

Written to `--out`: samples.jsonl (one object per sample), samples.csv (one row per process, metric and sample),
verdict.json, redis_keys.json (every key at the end: type, length, bytes), soak.png (one panel per metric) and
sr1-run.log. Exit code: 0 flat, 1 something grew (the message names the process and metric), 2 the run itself
failed (exited early, did not stop cleanly, or left processes behind).
"""

from __future__ import annotations

import argparse
import csv
import json
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the repository root: sr1's packages and scripts.*

from common.progress import PhaseProgress  # noqa: E402
from common.secrets import mask_argv  # noqa: E402
from scripts.chaos.soak_samples import (  # noqa: E402
    FLOOR,
    PROCESS_METRICS,
    REDIS_METRICS,
    REDIS_SERIES,
    UNITS,
    Growth,
    latest_labels,
    redis_client,
    redis_keys,
    sample_processes,
    sample_redis,
    verdict,
)

NEVER_REACHED_STEPS = 10_000_000
EXIT_GREW, EXIT_RUN_FAILED = 1, 2


def status_line(sample: dict) -> str:
    procs = sample["processes"].values()
    rss = sum(p["rss_mib"] for p in procs) / 1024
    line = f"{len(procs)} processes, RSS {rss:.2f} GiB"
    if sample.get("redis"):
        r = sample["redis"]
        line += f", version {r['version']}, Redis {r['used_memory_mib']:.2f} MiB / {r['keys']} keys"
    return line


def launch(args: argparse.Namespace, run_dir: Path, log_path: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "sr1", "run", args.preset, f"learner.total_steps={NEVER_REACHED_STEPS}"]
    cmd += [*args.overrides, "--run-dir", str(run_dir), "--no-live"]
    log = open(log_path, "w")  # noqa: SIM115 (the child writes it until it exits)
    # its own session: a Ctrl-C in this terminal reaches soak.py only, which stops the run in order
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)


def stop(run: subprocess.Popen, seen: dict[tuple[int, float], str], timeout_s: float) -> list[str]:
    """SIGTERM `sr1 run` (it stops its parts in order, the learner checkpointing first); the problems."""
    problems = []
    signalled = run.poll() is None
    if signalled:
        run.send_signal(signal.SIGTERM)
        try:
            run.wait(timeout_s)
        except subprocess.TimeoutExpired:
            problems.append(f"sr1 run did not stop within {timeout_s:.0f} s of SIGTERM; killed")
            run.kill()
            run.wait()
    if signalled and run.returncode != 130 and not problems:
        problems.append(f"sr1 run exited with {run.returncode} on SIGTERM (a clean stop is 130)")
    time.sleep(2.0)  # children die with their parent (PR_SET_PDEATHSIG): give them the moment it takes
    left = []
    for (pid, started), label in seen.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() != started or proc.status() == psutil.STATUS_ZOMBIE:
                continue  # gone (its pid reused by another process), or exited and not yet reaped
            left.append(proc)
        except psutil.NoSuchProcess:
            continue
        problems.append(f"orphan: {label} still alive after sr1 run stopped; killed")
    for proc in left:
        proc.kill()
    return problems


def _interrupt_on_signals() -> None:
    """`kill` (SIGTERM) and SIGINT stop a soak like Ctrl-C: the run is stopped in order, never orphaned. SIGINT is set
    again too: a shell that starts a job in the background (`nohup ... &`) has it ignored, and the run would inherit
    that."""

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def soak(args: argparse.Namespace) -> int:
    _interrupt_on_signals()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    run_dir, log_path = out / "run", out / "sr1-run.log"
    print(
        f"soak: sr1 run {args.preset} for {args.duration:.0f} s into {run_dir} (log: {log_path})", flush=True
    )
    run = launch(args, run_dir, log_path)
    seen: dict[tuple[int, float], str] = {}  # every process of the run ever sampled (the orphan check)
    samples: list[dict] = []
    client, problems, interrupted = None, [], False
    progress = PhaseProgress("soak", total=round(args.duration), unit="s")
    started = next_sample = time.monotonic()
    try:
        with progress, open(out / "samples.jsonl", "w") as jsonl:
            while (elapsed := time.monotonic() - started) < args.duration:
                if run.poll() is not None:
                    problems.append(f"sr1 run exited by itself with {run.returncode} after {elapsed:.0f} s")
                    break
                if time.monotonic() >= next_sample:
                    next_sample += args.interval
                    client = client or redis_client(run_dir)
                    sample = {
                        "t": round(elapsed, 1),
                        "time": time.time(),
                        "processes": sample_processes(run.pid, seen),
                        "redis": sample_redis(client),
                    }
                    samples.append(sample)
                    jsonl.write(json.dumps(sample) + "\n")
                    jsonl.flush()
                    progress.update(completed=int(elapsed), note=status_line(sample))
                else:
                    progress.update(completed=int(elapsed))
                time.sleep(min(1.0, max(0.0, next_sample - time.monotonic())))
    except KeyboardInterrupt:
        interrupted = True
        print("soak: interrupted; stopping the run", flush=True)
    finally:
        (out / "redis_keys.json").write_text(json.dumps(redis_keys(client), indent=1))
        problems += stop(run, seen, args.stop_timeout)
    if problems:
        print(
            f"soak: the run failed; see {log_path}:\n" + "\n".join(f"  {p}" for p in problems),
            file=sys.stderr,
        )
        print("".join(log_path.read_text().splitlines(keepends=True)[-20:]), file=sys.stderr)
    grew = judge(samples, out, args, problems)
    if problems or interrupted:
        return EXIT_RUN_FAILED
    return EXIT_GREW if grew else 0


def judge(samples: list[dict], out: Path, args: argparse.Namespace, run_problems: list[str]) -> list[str]:
    """samples.csv, soak.png and verdict.json from the samples; prints the growth per kind and metric; the
    problems of growth."""
    write_csv(samples, out / "samples.csv")
    results, grew = verdict(samples, warmup_s=args.warmup, window_s=args.window, bound=args.bound)
    plot(samples, out / "soak.png", args.warmup)
    report = {
        "command": " ".join(mask_argv(sys.argv)),  # its overrides may hold a password or a token
        "duration_s": args.duration,
        "interval_s": args.interval,
        "warmup_s": args.warmup,
        "window_s": args.window,
        "bound": args.bound,
        "floor": FLOOR,
        "samples": len(samples),
        "run_problems": run_problems,
        "growth_problems": grew,
        "growth": [asdict(r) for r in results],
    }
    (out / "verdict.json").write_text(json.dumps(report, indent=1))
    print(summary(results, grew, args.bound))
    print(f"soak: samples, verdict and plot in {out}")
    return grew


def summary(results: list[Growth], problems: list[str], bound: float) -> str:
    """The largest growth per kind and metric, then the verdict."""
    worst: dict[str, Growth] = {}
    for r in results:
        key = f"{r.series.split('[')[0]} {r.metric}" if "[" in r.series else r.series
        if key not in worst or r.growth > worst[key].growth:
            worst[key] = r
    lines = [f"  {key}: {r.growth:+.1%} ({r.first:.4g} -> {r.last:.4g})" for key, r in sorted(worst.items())]
    if problems:
        lines += ["soak: FAILED"] + [f"  {p}" for p in problems]
    else:
        lines.append(f"soak: flat (every series within {bound:.0%} or its floor)")
    return "growth after warm-up (largest per kind and metric):\n" + "\n".join(lines)


def write_csv(samples: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["t_s", "process", "kind", "pid", "metric", "value"])
        for s in samples:
            for label, p in s["processes"].items():
                for metric in PROCESS_METRICS:
                    writer.writerow([s["t"], label, p["kind"], p["pid"], metric, round(p[metric], 3)])
            for metric in REDIS_METRICS:
                if s.get("redis"):
                    writer.writerow(
                        [s["t"], REDIS_SERIES, REDIS_SERIES, "", metric, round(s["redis"][metric], 4)]
                    )


def plot(samples: list[dict], path: Path, warmup_s: float) -> None:
    """One panel per metric, one line per process; the warm-up shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [*PROCESS_METRICS, *REDIS_METRICS]
    latest = latest_labels(samples)
    fig, axes = plt.subplots(len(metrics), 1, figsize=(9, 2.2 * len(metrics)), sharex=True)
    for ax, metric in zip(axes, metrics, strict=True):
        lines: dict[str, tuple[list[float], list[float]]] = {}
        for s in samples:
            values = (
                {REDIS_SERIES: s["redis"]} if metric in REDIS_METRICS and s.get("redis") else s["processes"]
            )
            for label, p in values.items():
                if metric in p:
                    xs, ys = lines.setdefault(latest.get(p.get("pid"), label), ([], []))
                    xs.append(s["t"] / 60)
                    ys.append(p[metric])
        for label, (xs, ys) in sorted(lines.items()):
            ax.plot(xs, ys, label=label, linewidth=1)
        ax.axvspan(0, warmup_s / 60, color="0.9")
        ax.set_ylabel(UNITS[metric], fontsize=8)
        ax.tick_params(labelsize=7)
        if metric == "rss_mib" and lines:
            ax.legend(fontsize=6, ncol=3, loc="upper left")
    axes[-1].set_xlabel("minutes since sr1 run started (shaded: warm-up)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides for sr1 run (after --)")
    parser.add_argument("--preset", default="tiny", help="the preset sr1 run starts (default: tiny)")
    parser.add_argument("--duration", type=float, default=3600.0, help="seconds to run (default: 3600)")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between samples (default: 30)")
    parser.add_argument("--warmup", type=float, default=600.0, help="seconds not judged (default: 600)")
    parser.add_argument(
        "--window",
        type=float,
        default=300.0,
        help="the shortest span after warm-up a series is judged over (300)",
    )
    parser.add_argument("--bound", type=float, default=0.05, help="largest growth allowed (default: 0.05)")
    parser.add_argument("--stop-timeout", type=float, default=300.0, help="seconds to wait for a clean stop")
    parser.add_argument("--out", type=Path, help="output directory (default: runs/soak-<time>)")
    parser.add_argument(
        "--judge",
        type=Path,
        metavar="SAMPLES_JSONL",
        help="run nothing: judge and plot the samples of an earlier soak (into --out, default: beside them)",
    )
    args = parser.parse_args(argv)
    for name in ("duration", "interval", "window", "stop_timeout"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.warmup < 0 or args.bound < 0:
        parser.error(f"--warmup and --bound must be >= 0, got {args.warmup} and {args.bound}")
    if args.judge is None and args.duration - args.warmup < 2 * args.window:
        parser.error(
            f"--duration {args.duration:.0f} leaves {args.duration - args.warmup:.0f} s after the warm-up of "
            f"{args.warmup:.0f} s: at least two windows of {args.window:.0f} s are needed"
        )
    if args.judge is None and args.window < 2 * args.interval:
        parser.error(
            f"--window {args.window:.0f} s holds under 2 samples of --interval {args.interval:.0f} s"
        )
    if args.judge is not None:
        return judge_file(args)
    args.out = args.out or ROOT / "runs" / f"soak-{time.strftime('%Y%m%d-%H%M%S')}"
    return soak(args)


def judge_file(args: argparse.Namespace) -> int:
    """`--judge samples.jsonl`: the verdict, plot and CSV of samples written before, with this call's bounds."""
    try:
        samples = [json.loads(line) for line in args.judge.read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as err:
        print(f"soak: --judge {args.judge}: not a samples.jsonl ({err})", file=sys.stderr)
        return EXIT_RUN_FAILED
    if not samples:
        print(f"soak: --judge {args.judge}: no samples in it", file=sys.stderr)
        return EXIT_RUN_FAILED
    args.duration = samples[-1]["t"]
    out = (args.out or args.judge.parent).resolve()
    out.mkdir(parents=True, exist_ok=True)
    return EXIT_GREW if judge(samples, out, args, []) else 0


if __name__ == "__main__":
    sys.exit(main())
