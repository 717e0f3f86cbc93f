"""One prepared GPU call that measures the learner: `bash scripts/gpu_check.sh` (docs/learner-gpu.md, "The GPU check").

    bash scripts/gpu_check.sh                      # on the GPU machine: at most --budget-s (480) seconds
    DRY=1 bash scripts/gpu_check.sh                # on CPU, here and in CI: the same stages with a tiny model
    OUT=results/ bash scripts/gpu_check.sh         # where the results go (default runs/gpu-check-<time>/)

A GPU machine is lent for minutes at a time, so one run measures everything, each stage in its own process under its
own time limit; a stage is skipped, with the reason, when what is left of the overall budget is less than it needs.
In order of what matters most (every benchmark stage: Search-R1's step of sr1's 8xH100 preset, random weights):

  0 env            versions, a bf16 matmul rate, each attention kernel's time and the checkpointing a 6-rank
                   learner picks per shape (learner/execution/plan.py, as the learner plans), the GPU tier's kernel
                   tests (attention, heads, compiled layers without graph breaks, checkpointing policies, host syncs)
  1 3b             Qwen2.5-3B, the preset's full checkpointing, with the plain PyTorch step, a profile's top ops
  2 3b-lora        Qwen2.5-3B, LoRA rank 16 on every linear layer, the checkpointing the learner picks for it (against
                   stage 1's full weights; MFU on the FLOPs a LoRA step does, peak against the LoRA estimate)
  3 1.5b           Qwen2.5-1.5B, full checkpointing, with the plain step
  4 0.5b           Qwen2.5-0.5B, no checkpointing, with the plain step (the fused head)
  5 3b-none        Qwen2.5-3B without checkpointing, with the plain step ("does not fit" where the estimate says so)
  6 3b-selective   Qwen2.5-3B with selective checkpointing (the plain step has no such policy)
  7 0.5b-chunked   Qwen2.5-0.5B with the chunked head instead of the fused one (against stage 4)
  8 gpu-tier       the rest of the GPU test tier (tests/gpu)
  9 3b-6-ranks     (time left over) Qwen2.5-3B with the checkpointing a 6-rank learner picks on this GPU
 10 3b-offload     (time left over) Qwen2.5-3B with learner.cpu_offload, one update

Stages 0-8 are planned to take 420 s of the 480 s budget; 9 and 10 run when the earlier ones were quicker. Stage 2
made room for itself with fewer trajectories per update elsewhere: stage 1 24 (was 32), stages 3, 4 and 7 16 (32),
stages 5 and 6 12 (16); those stages' expected seconds are estimates, no GPU has run them yet.

Before the stages, the wheels in `.whl/` (scripts/gpu_wheels.sh fetches them; the GPU image lacks pydantic and the
redis client) are unpacked into a temporary directory on the children's PYTHONPATH. Each stage writes its raw
output to `OUT/<stage>.log` (a benchmark's full figures to `OUT/<stage>.json`, pytest's to `OUT/<stage>.xml`) and
one JSON line to `OUT/stages.jsonl`; a table of every stage ends the run (also in `OUT/table.txt`).

DRY=1 runs the same stages, flags and code paths on the CPU with the small random model and tiny sizes: the wheels are
resolved for CPython 3.12 and unpacked but not used, and every stage runs with the modules the GPU image lacks made
unimportable (and the stdlib modules Python 3.12 removed), so an import, a flag or a path that would fail there fails
here first. This script itself needs only the standard library.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root: scripts.* (this file is run by path)

from scripts.gpu_env import dry_blocker, install_wheels, stage_env, wheel_requirements  # noqa: E402
from scripts.gpu_probe import probe  # noqa: E402

# pytest-asyncio and pytest-timeout are not on the GPU image: the same run here goes without them
PYTEST = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:asyncio", "-p", "no:timeout"]
HEARTBEAT_S = 10
BUDGET_S = 480  # the stages' seconds; with the machine's start and the wheels, about 11 minutes of a lent GPU
DOES_NOT_FIT = (
    3  # bench_learner.py's exit status when the settings asked for cannot fit the device at one rank
)


@dataclass(frozen=True)
class Stage:
    key: str
    title: str
    timeout_s: int  # its own limit
    needs_s: int  # skipped when less than this is left of the overall budget
    commands: tuple[tuple[str, ...], ...]  # run in order; a stage fails at its first failing command
    kind: str = (
        "bench"  # bench: OUT/<key>.json holds the figures; tests: OUT/<key>.xml; env: the probe's JSON
    )


@dataclass
class Outcome:
    row: dict
    lines: list[str] = field(default_factory=list)


def _bench(key: str, out: Path, dry: bool, shape: str, trajectories: int, *extra: str) -> tuple[str, ...]:
    """bench_learner.py on the Search-R1 workload of sr1's 8xH100 preset: one timed step of two updates of
    `trajectories`, after a warm-up step of two updates of a quarter of that. DRY=1: the small random model on the
    CPU, every length x 0.05, four trajectories per update."""
    args = ["scripts/bench/bench_learner.py", "--workload", "search-r1", "--preset", "qwen2.5-3b-8xh100"]
    args += ["--steps", "1", "--updates", "2"]
    if dry:
        args += ["--device", "cpu", "--dtype", "float32", "--length-scale", "0.05", "--budget", "1024"]
        args += ["--trajectories", "4", "--warmup-trajectories", "1"]
    else:
        args += [
            "--device",
            "cuda",
            "--shape",
            shape,
            "--shape-cache",
            str(Path(tempfile.gettempdir()) / "sr1-shapes"),
        ]
        args += ["--trajectories", str(trajectories), "--warmup-trajectories", str(max(1, trajectories // 4))]
    return (*args, *extra, "--json-out", str(out / f"{key}.json"))


OPTIONAL = ("9-3b-6-ranks", "10-3b-offload")  # run when the stages before them left the time
# LoRA as the search-r1-grpo-lora-* presets train it: rank 16 on every linear layer of each decoder layer, with the
# checkpointing the learner picks for it (auto: none for 3B at 1 or 6 ranks on an H100 or H200, by memory.py's estimate)
LORA = "--lora-rank 16 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
# key, title, timeout_s, needs_s, shape, trajectories per update, bench_learner.py's options
BENCH_STAGES = (
    ("1-3b", "3B, full checkpointing, plain step, profile", 160, 95, "qwen2.5-3b", 24,
     "--plain --checkpointing full --profile 20 --profile-trajectories 8"),
    ("2-3b-lora", "3B, LoRA rank 16 on every linear layer, the learner's checkpointing", 100, 45, "qwen2.5-3b", 16,
     f"--no-plain {LORA} --checkpointing auto"),
    ("3-1.5b", "1.5B, full checkpointing, plain step", 110, 45, "qwen2.5-1.5b", 16, "--plain --checkpointing full"),
    ("4-0.5b", "0.5B, no checkpointing, plain step", 80, 30, "qwen2.5-0.5b", 16, "--plain --checkpointing none"),
    ("5-3b-none", "3B, no checkpointing, plain step", 120, 55, "qwen2.5-3b", 12, "--plain --checkpointing none"),
    ("6-3b-selective", "3B, selective checkpointing", 100, 45, "qwen2.5-3b", 12,
     "--no-plain --checkpointing selective"),
    ("7-0.5b-chunked", "0.5B, the chunked head", 70, 20, "qwen2.5-0.5b", 16,
     "--no-plain --checkpointing none --logprob-head chunked"),
    ("9-3b-6-ranks", "3B, a 6-rank learner's checkpointing", 100, 55, "qwen2.5-3b", 16,
     "--no-plain --checkpointing-for-ranks 6"),
    ("10-3b-offload", "3B, cpu_offload, one update", 120, 70, "qwen2.5-3b", 12, "--no-plain --cpu-offload --updates 1"),
)  # fmt: skip
# the GPU tier's tests stage 0 runs (the kernels the figures rest on); stage 8 runs the others
KERNEL_TESTS = "attention or chunked or head or picks or compiled or policy or synchronisation or copies"


def stages(out: Path, dry: bool) -> list[Stage]:
    """The stages in order of importance. Limits from the last measurement (an H200, before compiled layers: 3B 11.7k
    tokens/s, 1.5B 22.6k, 0.5B 44k; each stage loads its models and compiles again, from the compiler's cache after
    the first; the 3B model stage 1 writes is read again from the shape cache): `needs_s` is what a stage is expected
    to take, `timeout_s` its cap. DRY=1: seconds each, on CPU."""
    tests = (*PYTEST, "-m", "gpu", "tests/gpu")

    def bench(key: str, title: str, timeout_s: int, needs_s: int, shape: str, n: int, *extra: str) -> Stage:
        return Stage(key, title, timeout_s, needs_s, (_bench(key, out, dry, shape, n, *extra),))

    return [
        Stage(
            "0-env",
            "versions, bf16 matmul, attention times, 3B's plans, kernel tests",
            130,
            55,
            (
                ("scripts/gpu_check.py", "--probe", str(out / "0-env.probe.json")),
                (*tests, "-k", KERNEL_TESTS, f"--junitxml={out / '0-env.xml'}"),
            ),
            kind="env",
        ),
        *(bench(*row[:6], *row[6].split()) for row in BENCH_STAGES if row[0] not in OPTIONAL),
        Stage(
            "8-gpu-tier",
            "the rest of the GPU test tier",
            120,
            30,
            ((*tests, "-k", f"not ({KERNEL_TESTS})", f"--junitxml={out / '8-gpu-tier.xml'}"),),
            kind="tests",
        ),
        *(bench(*row[:6], *row[6].split()) for row in BENCH_STAGES if row[0] in OPTIONAL),  # time left over
    ]


# -- running a stage -------------------------------------------------------------------------------------------------


def run_command(cmd: list[str], env: dict, log, timeout_s: float, say) -> tuple[int | None, float]:
    """Run `cmd` in its own process group, output to `log`; (exit status, seconds), status None when it ran past
    `timeout_s` (its whole process group is then ended: SIGTERM, SIGKILL 5 s later)."""
    start = time.monotonic()
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    while True:
        try:
            proc.wait(timeout=min(HEARTBEAT_S, max(0.1, timeout_s - (time.monotonic() - start))))
            return proc.returncode, time.monotonic() - start
        except subprocess.TimeoutExpired:
            elapsed = time.monotonic() - start
            if elapsed >= timeout_s:
                break
            say(f"  ... {elapsed:.0f} s of {timeout_s:.0f} s")
    for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    return None, time.monotonic() - start


def decide(stage: Stage, left_s: float) -> tuple[float | None, str | None]:
    """(time limit, None) to run the stage with what is left of the budget, or (None, why it is skipped)."""
    if left_s < stage.needs_s:
        return None, f"{left_s:.0f} s left of the budget, the stage needs {stage.needs_s} s"
    return min(stage.timeout_s, left_s), None


def _tests_row(xml: Path) -> dict:
    if not xml.exists():
        return {}
    suite = ElementTree.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return {f"tests/{k}": v for k, v in counts.items()}


def _bench_row(path: Path) -> dict:
    """The figures of one benchmark stage that go into its row (the whole object stays in OUT/<stage>.json)."""
    if not path.exists():
        return {}
    figures = json.loads(path.read_text())
    keys = {
        "gpu": "gpu",
        "device": "device",
        "workload": "workload",
        "shape": "shape",
        "checkpointing": "gradient_checkpointing",
        "checkpointing_why": "gradient_checkpointing_why",
        "attention": "attention",
        "attention_seconds": "attention_seconds",
        "compile": "compile",
        "logprob_head": "logprob_head",
        "lora": "lora",
        "trained_parameters": "trained_parameters",
        "execution": "execution",
        "tokens_per_s": "packed/tokens_per_s",
        "mfu": "packed/mfu",
        "mfu_all_passes": "packed/mfu_all_passes",
        "x_plain": "ratio_packed_over_plain",
        "plain_tokens_per_s": "plain/tokens_per_s",
        "plain_mfu": "plain/mfu",
        "peak_gib": "packed/peak_gib",
        "plain_peak_gib": "plain/peak_gib",
        "estimate_gib": "packed/estimate_gib",
        "recompiles": "compiler/recompiles",
        "timed_recompiles": "compiler/timed/recompiles",
        "graph_breaks": "compiler/graph_breaks",
        "graphs": "compiler/graphs",
        "tokens_per_update": "tokens_per_update",
        "commit": "commit",
    }
    return {mine: figures.get(theirs) for mine, theirs in keys.items()}


def run_stage(stage: Stage, out: Path, env: dict, timeout_s: float, say) -> dict:
    row = {"stage": stage.key, "title": stage.title}
    with open(out / f"{stage.key}.log", "w") as log:
        status, seconds = "ok", 0.0
        for cmd in stage.commands:
            left = timeout_s - seconds
            code, took = run_command([sys.executable, *cmd], env, log, left, say)
            seconds += took
            if code is None:
                status = f"timeout after {timeout_s:.0f} s"
                break
            if (
                code == DOES_NOT_FIT
            ):  # bench_learner.py: what the stage asks for cannot fit this GPU at one rank
                status = "does not fit"
                break
            if code != 0:
                status = f"failed (exit {code})"
                break
    row |= {"status": status, "seconds": round(seconds, 1), "log": str(out / f"{stage.key}.log")}
    if stage.kind == "bench":
        row |= _bench_row(out / f"{stage.key}.json")
    else:
        row |= _tests_row(out / f"{stage.key}.xml")
    if stage.kind == "env":
        probe = out / "0-env.probe.json"
        row |= json.loads(probe.read_text()) if probe.exists() else {}
    if status != "ok":
        row["error"] = _last_error(out / f"{stage.key}.log")
    return row


def _last_error(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [
        line for line in lines if "Error" in line or "error:" in line or line.startswith("bench_learner.py:")
    ]
    return (errors or lines or [""])[-1][-400:]


# -- the run ---------------------------------------------------------------------------------------------------------

COLUMNS = (
    ("stage", "stage", "{}"),
    ("status", "status", "{}"),
    ("GPU", "gpu", "{}"),
    ("workload", "workload", "{}"),
    ("ckpt", "checkpointing", "{}"),
    ("head", "logprob_head", "{}"),
    ("tokens/s", "tokens_per_s", "{:,.0f}"),
    ("MFU", "mfu", "{:.3f}"),
    ("x plain", "x_plain", "{:.2f}"),
    ("peak GiB", "peak_gib", "{:.1f}"),
    ("est. GiB", "estimate_gib", "{:.1f}"),
    ("recompiles (timed)", "recompiles", "{}"),
)


def table(rows: list[dict]) -> str:
    """One line per stage: stage, status, GPU, workload, checkpointing, log-prob head, tokens/s, MFU, x plain, peak
    and estimated GiB, recompilations (those in the timed steps in brackets)."""

    def cell(row: dict, key: str, fmt: str) -> str:
        value = row.get(key)
        if key == "status":
            return str(value).split(" (")[0].split(" after")[0]
        if key == "gpu":
            value = value or row.get("device")
        if value is None:
            return "-"
        if key == "recompiles" and row.get("timed_recompiles") is not None:
            return f"{value} ({row['timed_recompiles']})"
        return fmt.format(value)

    cells = [[title for title, _, _ in COLUMNS]]
    cells += [[cell(row, key, fmt) for _, key, fmt in COLUMNS] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="One prepared GPU call that measures the learner (DRY=1: on CPU)"
    )
    parser.add_argument(
        "--budget-s", type=float, default=BUDGET_S, help=f"the whole run's seconds ({BUDGET_S})"
    )
    parser.add_argument(
        "--only", default=None, help="comma-separated stage keys or numbers to run (default: all)"
    )
    parser.add_argument(
        "--out", default=None, help="results directory (default: $OUT, else runs/gpu-check-TIME)"
    )
    parser.add_argument("--probe", default=None, metavar="FILE", help=argparse.SUPPRESS)
    parser.add_argument(
        "--wheel-requirements", action="store_true", help="print what gpu_wheels.sh downloads"
    )
    args = parser.parse_args(argv)
    if args.probe:
        probe(Path(args.probe))
        return 0
    if args.wheel_requirements:
        print("\n".join(wheel_requirements()))
        return 0
    started = time.monotonic()
    dry = os.environ.get("DRY", "").lower() not in ("", "0", "false", "no")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = Path(
        args.out or os.environ.get("OUT") or ROOT / "runs" / f"gpu-check-{stamp}{'-dry' if dry else ''}"
    )
    out.mkdir(parents=True, exist_ok=True)

    def say(line: str) -> None:
        print(f"[{time.monotonic() - started:5.0f} s] {line}", flush=True)

    with open(out / "setup.log", "w") as log:
        site, note = install_wheels(dry, log)
    say(note)
    blocker = dry_blocker(out / ".dry-imports") if dry else None
    env = stage_env(site, blocker)
    chosen = stages(out, dry)
    if args.only:
        wanted = set(args.only.split(","))
        chosen = [s for s in chosen if s.key in wanted or s.key.split("-")[0] in wanted]
    rows = []
    with open(out / "stages.jsonl", "w") as jsonl:
        for stage in chosen:
            limit, why = decide(stage, args.budget_s - (time.monotonic() - started))
            if limit is None:
                row = {"stage": stage.key, "title": stage.title, "status": "skipped", "reason": why}
            else:
                say(f"stage {stage.key}: {stage.title} (limit {limit:.0f} s)")
                row = run_stage(stage, out, env, limit, say)
            row |= {"dry": dry, "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            say(f"stage {stage.key}: {row['status']}" + (f" — {row['error']}" if row.get("error") else ""))
            jsonl.write(json.dumps(row) + "\n")
            jsonl.flush()
            rows.append(row)
    text = table(rows)
    (out / "table.txt").write_text(text + "\n")
    print(f"\n{text}\n\nresults: {out} ({time.monotonic() - started:.0f} s)")
    return 0 if all(r["status"] in ("ok", "skipped", "does not fit") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
