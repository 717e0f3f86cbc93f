"""Checkpoint faults for `scripts/chaos.py --checkpoint-faults`: a torn checkpoint and a full disk, in one real run.

    python scripts/chaos.py --checkpoint-faults                    # the disk fills up through the test hook
    python scripts/chaos.py --checkpoint-faults --disk-full tmpfs  # a real size-limited tmpfs (needs root)

One `sr1 run` of the tiny preset, a checkpoint every `c` steps (2 by default), `6c` steps:
1. torn-checkpoint: once step_2c is written, `sr1 run` is SIGKILLed (as when a node dies), every file of step_2c
   over 4 kB is cut to half its size, and the run is resumed. The learner must skip step_2c, naming it, load step_c,
   and generate again the groups step_2c had acked.
2. disk-full: once the resumed learner writes its next checkpoint (step_3c), the disk fills up: step_4c fails and
   training goes on, step_5c fails too and the learner stops; `sr1 run` must exit with 74 (EXIT_CHECKPOINT_FAILED)
   and say how much space the next checkpoint needs. Space is freed and the run resumed: it goes on from step_3c
   and finishes.
The disk fills up either through the checkpoint writer's test hook (`SR1TEST_DISK_FULL`: its own writes raise
ENOSPC; no privileges needed, what CI runs) or for real: `<run_dir>/checkpoints` is a tmpfs of `--tmpfs-mb` and a
ballast file takes its free space (root with CAP_SYS_ADMIN only). Both are checked by the audit of `chaos.py`
(complete, nothing lost or trained twice, versions only go up, bound held, no orphans) and by `CheckpointFaults`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from chaos import ChaosRun, Verdict, run_overrides, verify

CHECKPOINT_FAULTS = ("torn-checkpoint", "disk-full")
EXIT_CHECKPOINT_FAILED = (
    74  # config.EXIT_CHECKPOINT_FAILED (this script imports nothing of the project's config)
)


@dataclass
class CheckpointFaults:
    """What the run said about each fault."""

    torn: str  # the checkpoint torn
    skipped: list[str]  # the checkpoints the resume after the tear skipped, with why
    fell_back_to: int  # the checkpoint it loaded instead
    stop_code: int  # `sr1 run`'s exit status when the second checkpoint in a row failed
    stop_message: str  # the learner's message in that output (space needed, how to go on)
    failed_in_a_row: int  # the largest `checkpoint/failed_in_a_row` in metrics.jsonl

    def missing(self, every: int) -> list[str]:
        """What a correct run would have shown and this one did not."""
        problems = []
        if not any(s.startswith(f"{self.torn}:") for s in self.skipped):
            problems.append(f"the resume did not skip {self.torn}: {self.skipped}")
        if self.fell_back_to != every:
            problems.append(f"the resume loaded step_{self.fell_back_to}, not step_{every}")
        if self.stop_code != EXIT_CHECKPOINT_FAILED:
            problems.append(f"sr1 run exited with {self.stop_code}, not {EXIT_CHECKPOINT_FAILED}")
        if "needs about" not in self.stop_message or "2 checkpoints in a row" not in self.stop_message:
            problems.append(f"no space needed in the stop message: {self.stop_message[-500:]!r}")
        if self.failed_in_a_row != 1:
            problems.append(f"checkpoint/failed_in_a_row peaked at {self.failed_in_a_row}, not 1")
        return problems


class DiskFull:
    """Fills the disk of `<run_dir>/checkpoints` and frees it again: through the test hook, or a real tmpfs."""

    def __init__(self, run_dir: Path, how: str, tmpfs_mb: int):
        self.how = how
        self.checkpoints = run_dir / "checkpoints"
        self.trigger = run_dir.parent / f"{run_dir.name}-disk-full"
        self.ballast = self.checkpoints / "ballast"
        if how == "tmpfs":
            self.checkpoints.mkdir(parents=True)
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={tmpfs_mb}m", "tmpfs", str(self.checkpoints)],
                check=True,
            )

    @property
    def env(self) -> dict[str, str]:
        return {"SR1TEST_DISK_FULL": str(self.trigger)} if self.how == "hook" else {}

    def fill(self) -> None:
        if self.how == "hook":
            self.trigger.write_text("20000")  # each save writes 20 kB of its weights, then ENOSPC
            return
        free = os.statvfs(self.checkpoints).f_bavail * os.statvfs(self.checkpoints).f_frsize
        with open(self.ballast, "wb") as handle:  # all but 64 kB: a checkpoint fails part-way through
            for _ in range(max(0, free - (64 << 10)) >> 20):
                handle.write(b"\0" * (1 << 20))

    def free(self) -> None:
        self.trigger.unlink(missing_ok=True)
        self.ballast.unlink(missing_ok=True)

    def close(self) -> None:
        self.free()
        if self.how == "tmpfs":
            subprocess.run(["umount", "--lazy", str(self.checkpoints)], check=False)


def _wait_latest(chaos: ChaosRun, version: int, timeout_s: float = 900) -> None:
    chaos.wait(lambda: chaos.latest_checkpoint() == version, timeout_s, f"checkpoint step_{version}")


def _freeze_learner(chaos: ChaosRun, sig: int) -> None:
    for proc in chaos.processes("learner"):
        proc.send_signal(sig)


def tear(checkpoint: Path) -> list[str]:
    """Cut every file of `checkpoint` over 4 kB to half its size, as a node that died mid-write leaves them."""
    cut = []
    for path in sorted(checkpoint.rglob("*")):
        if path.is_file() and path.stat().st_size > 4096:
            os.truncate(path, path.stat().st_size // 2)
            cut.append(str(path.relative_to(checkpoint)))
    return cut


def run_checkpoint_faults(
    run_dir: Path,
    *,
    every: int = 2,
    max_staleness: int = 2,
    disk_full: str = "hook",
    tmpfs_mb: int = 512,
) -> tuple[Verdict, CheckpointFaults]:
    """One run of `6 * every` steps with a torn checkpoint, then a full disk (see the module's docstring)."""
    steps = 6 * every
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    disk = DiskFull(run_dir, disk_full, tmpfs_mb)
    chaos = ChaosRun(run_dir, run_overrides(steps, every, max_staleness), env=disk.env)
    published: list[int] = []
    try:
        # 1. torn-checkpoint: killed once step_2c exists, its files cut to half, resumed
        _wait_latest(chaos, 2 * every)
        published.append(chaos.version() or 0)
        chaos.kill_parent()
        torn = run_dir / "checkpoints" / f"step_{2 * every}"
        print(f"tearing {torn.name}: {', '.join(tear(torn))}", flush=True)
        chaos.resume()
        # 2. disk-full: once the resumed learner writes its next checkpoint, two in a row fail
        good = (max(published[-1], 2 * every) // every + 1) * every
        _wait_latest(chaos, good)
        _freeze_learner(chaos, signal.SIGSTOP)  # the fault lands before the next save whatever the step time
        published.append(chaos.version() or 0)  # read while the run's Redis is up
        disk.fill()
        _freeze_learner(chaos, signal.SIGCONT)
        print(f"disk full after step_{good} ({disk_full})", flush=True)
        stop_code = chaos.finish()
        stop_message = chaos.log_path(chaos.launches - 1).read_text()
        disk.free()
        chaos.resume()
        returncode = chaos.finish()
    finally:
        chaos.kill_everything_left()
        disk.close()
    starts = [
        json.loads(x) for x in (run_dir / "learner_groups.jsonl").read_text().splitlines() if '"start"' in x
    ]
    after_tear = starts[1]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    faults = CheckpointFaults(
        torn=torn.name,
        skipped=[f"{s['checkpoint']}: {s['why']}" for s in after_tear.get("skipped", [])],
        fell_back_to=int(after_tear["weights"]),
        stop_code=stop_code,
        stop_message=stop_message,
        failed_in_a_row=int(max(r.get("checkpoint/failed_in_a_row", 0) for r in rows)),
    )
    return verify(chaos, returncode, steps, max_staleness, published), faults


def report(verdict: Verdict, faults: CheckpointFaults, every: int) -> int:
    """Print the outcome; the exit status of `chaos.py --checkpoint-faults`."""
    print(verdict)
    print(f"torn {faults.torn}; the resume skipped {faults.skipped} and loaded step_{faults.fell_back_to}")
    print(f"the full disk stopped the run with exit status {faults.stop_code}")
    missing = faults.missing(every)
    for problem in missing:
        print(f"not as expected: {problem}")
    return 0 if verdict.ok and not missing else 1
