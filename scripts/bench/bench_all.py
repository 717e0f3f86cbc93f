"""Every CPU benchmark of docs/benchmarks.md, each from a fresh clone, several rounds: the range of every ratio.

    python scripts/bench/bench_all.py                         # 3 rounds, each a fresh `git clone` of HEAD; ~1 h here
    python scripts/bench/bench_all.py --rounds 1 --only buffer,learner --out runs/bench-all-quick
    python scripts/bench/bench_all.py --rev 1b8fd12 --out runs/bench-all-before   # an earlier commit, to compare
    python scripts/bench/bench_all.py --rounds 2 --append --out runs/bench-all      # two more rounds into the same table
    python scripts/bench/bench_all.py --report-only --out runs/bench-all            # the table again, from results.json

A round clones the repository's committed HEAD (or `--rev`) into a temporary directory (no index, world or cache
of this checkout comes along) and runs each benchmark script there with this Python, one after another, `--json`.
The scripts measure sr1 and its baseline in the same run, so each round gives one ratio per figure; this reports
the lowest and highest over the rounds (never a best run), with the date, the commit and the CPU model, in
`<out>/table.md` and `<out>/results.json` (with each benchmark's seconds and the load average before and after it,
so a round that shared the machine shows). A benchmark that fails is reported with its error and the others go on.
The tiny world `bench_generators.py` samples from is built once, in `<out>/world` (copied from this checkout's
`runs/.world-cache/seed0` when it holds one: a build on this machine gives the same bytes, docs/tiny-world.md), and
reused by every round: it is the benchmark's input, not what it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

ROOT = Path(__file__).resolve().parents[2]


def _get(result: dict, path: str) -> float:
    value = result
    for key in path.split("."):
        value = value[int(key)] if isinstance(value, list) else value[key]
    return float(value)


# name -> (command line after the script path, {figure: (key path in its --json object, what it compares)})
BENCHMARKS: dict[str, tuple[list[str], dict[str, tuple[str, str]]]] = {
    "buffer": (
        ["scripts/bench/bench_buffer.py", "--json"],
        {"buffer put->take->ack vs raw streams": ("ratio_ours_vs_raw", "groups/s ratio")},
    ),
    "buffer_producers": (
        ["scripts/bench/bench_buffer.py", "--producers", "8", "--json"],
        {"buffer, 8 producer processes vs 1": ("ratio_vs_1_producer", "groups/s ratio")},
    ),
    "retrieval": (
        ["scripts/bench/bench_retrieval.py", "--json"],
        {
            "retrieval BM25 vs one-request-at-a-time": ("methods.bm25.ratio_qps_c128", "q/s ratio at c=128"),
            "retrieval BM25, one worker, vs one-request-at-a-time": (
                "methods.bm25.ratio_qps_c128_1_worker",
                "q/s ratio at c=128",
            ),
            "retrieval dense-Flat vs one-request-at-a-time": (
                "methods.dense_flat.ratio_qps_c128",
                "q/s ratio at c=128",
            ),
        },
    ),
    "generators": (
        ["scripts/bench/bench_generators.py", "--json", "--world", "{world}"],
        {
            "agent loop vs raw generation": ("ratio", "tokens/s ratio"),
            "replay vs raw (the engine's multi-turn work)": ("replay_ratio", "tokens/s ratio"),
            "agent vs replay (the agent loop itself)": ("agent_over_replay_ratio", "tokens/s ratio"),
            "engine wrapper vs raw (log-probs, streaming)": ("wrapper_ratio", "tokens/s ratio"),
        },
    ),
    "generators_costly_forward": (
        ["scripts/bench/bench_generators.py", "--json", "--world", "{world}", "--identity-layers", "14"],
        {
            "agent loop vs raw, a forward as costly as 16 layers": ("ratio", "tokens/s ratio"),
            "agent vs replay, a forward as costly as 16 layers": (
                "agent_over_replay_ratio",
                "tokens/s ratio",
            ),
            "replay vs raw, a forward as costly as 16 layers": ("replay_ratio", "tokens/s ratio"),
        },
    ),
    "weight_sync": (
        ["scripts/bench/bench_weight_sync.py", "--json", "--skip-learner"],
        {
            "weight publish fp32 vs raw broadcast": (
                "dtypes.float32.ratio_publish_over_raw",
                "bandwidth ratio",
            ),
            "weight publish bf16 vs raw broadcast": (
                "dtypes.bfloat16.ratio_publish_over_raw",
                "bandwidth ratio",
            ),
        },
    ),
    "learner": (
        ["scripts/bench/bench_learner.py", "--json"],
        {"learner packed vs padded": ("ratio_packed_over_padded", "tokens/s ratio")},
    ),
    "logprob_memory": (
        ["scripts/bench/logprob_memory.py", "--tokens", "2048,4096", "--json"],
        {
            "chunked log-probs, 2,048 tokens at vocab 151,936: peak": (
                "sizes.0.peak_ratio_chunked_over_unchunked",
                "peak memory ratio",
            ),
            "chunked log-probs, 2,048 tokens: speed": (
                "sizes.0.speed_ratio_chunked_over_unchunked",
                "tokens/s ratio",
            ),
            "chunked log-probs, 4,096 tokens: peak": (
                "sizes.1.peak_ratio_chunked_over_unchunked",
                "peak memory ratio",
            ),
            "chunked log-probs, 4,096 tokens: speed": (
                "sizes.1.speed_ratio_chunked_over_unchunked",
                "tokens/s ratio",
            ),
        },
    ),
}


def cpu_model() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown CPU"


def run_one(clone: Path, argv: list[str], timeout_s: float, world: Path) -> dict:
    """One benchmark in `clone`: its --json object (the last line it prints), or {"error": ...}."""
    argv = [arg.replace("{world}", str(world)) for arg in argv]
    started, load_before = time.monotonic(), os.getloadavg()[0]
    # the clone's packages first, in this process and in every process it starts (servers, engines, receivers),
    # ahead of whatever checkout this Python's editable install points at
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(clone), os.environ.get("PYTHONPATH")]))
    }
    proc = subprocess.run(
        [sys.executable, *argv],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    seconds = round(time.monotonic() - started, 1)
    load = {
        "seconds": seconds,
        "load_avg_before": round(load_before, 2),
        "load_avg_after": round(os.getloadavg()[0], 2),
    }
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)} | load
    return json.loads(lines[-1]) | load


def table(rounds: list[dict[str, dict]], header: dict) -> str:
    lines = [
        "# CPU benchmarks: range over fresh-clone rounds",
        "",
        *(f"- {k}: {v}" for k, v in header.items()),
        "",
        "| figure | compares | min | max | every round |",
        "|---|---|---|---|---|",
    ]
    for name, (_, figures) in BENCHMARKS.items():
        for figure, (path, what) in figures.items():
            values, errors = [], []
            for r in rounds:
                result = r.get(name)
                if result is None:
                    continue
                try:
                    values.append(_get(result, path))
                except (KeyError, IndexError, TypeError, ValueError):
                    errors.append(result.get("error", f"no {path}"))
            if not values and not errors:
                continue
            every = ", ".join(f"{v:.3g}" for v in values) + (f" ({len(errors)} failed)" if errors else "")
            low, high = (f"{min(values):.3g}", f"{max(values):.3g}") if values else ("-", "-")
            lines.append(f"| {figure} | {what} | {low} | {high} | {every} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="fresh clones, one after another (default 3)")
    parser.add_argument(
        "--only", default=",".join(BENCHMARKS), help=f"comma-separated: {', '.join(BENCHMARKS)}"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("runs/bench-all"), help="where table.md and results go"
    )
    parser.add_argument("--rev", default="HEAD", help="the commit to clone and measure (default: HEAD)")
    parser.add_argument(
        "--append",
        action="store_true",
        help="add the rounds to <out>/results.json (same commit) instead of starting anew",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="write <out>/table.md again from <out>/results.json, run nothing",
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one benchmark may take")
    args = parser.parse_args(argv)
    if args.report_only:
        recorded = json.loads((args.out / "results.json").read_text())
        (args.out / "table.md").write_text(table(recorded["rounds"], recorded["header"]))
        print((args.out / "table.md").read_text())
        return 0
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    if unknown := [n for n in names if n not in BENCHMARKS]:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", args.rev], cwd=ROOT, capture_output=True, text=True
    )
    if commit.returncode != 0:
        parser.error(f"--rev {args.rev!r} is not a commit of this repository")
    header = {
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit.stdout.strip() or "unknown",
        "CPU": cpu_model(),
        "rounds": args.rounds,
        "command": "python scripts/bench/bench_all.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    world = (args.out / "world").resolve()
    if not world.exists() and (ROOT / "runs" / ".world-cache" / "seed0" / "tiny_world.json").exists():
        shutil.copytree(ROOT / "runs" / ".world-cache" / "seed0", world)
    rounds: list[dict[str, dict]] = []
    if args.append and (args.out / "results.json").exists():
        earlier = json.loads((args.out / "results.json").read_text())
        if earlier["header"]["commit"] != header["commit"]:
            parser.error(
                f"--append: {args.out} holds rounds of commit {earlier['header']['commit']}, not {header['commit']}"
            )
        rounds = earlier["rounds"]
        header["command"] = f"{earlier['header']['command']}; then {header['command']}"
    header["rounds"] = len(rounds) + args.rounds
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns) as progress:
        bar = progress.add_task("benchmarks", total=args.rounds * len(names))
        first = len(rounds)
        for i in range(first, first + args.rounds):
            with tempfile.TemporaryDirectory(prefix="sr1-bench-clone-") as tmp:
                clone = Path(tmp) / "sr1"
                subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
                subprocess.run(["git", "checkout", "-q", header["commit"]], cwd=clone, check=True)
                results: dict[str, dict] = {}
                for name in names:
                    progress.update(bar, description=f"round {i + 1}/{header['rounds']}: {name}")
                    try:
                        results[name] = run_one(clone, BENCHMARKS[name][0], args.timeout, world)
                    except subprocess.TimeoutExpired:
                        results[name] = {"error": f"timed out after {args.timeout:.0f} s"}
                    progress.advance(bar)
                rounds.append(results)
            (args.out / "results.json").write_text(json.dumps({"header": header, "rounds": rounds}, indent=1))
            (args.out / "table.md").write_text(table(rounds, header))
    print((args.out / "table.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
