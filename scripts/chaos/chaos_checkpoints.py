"""Checkpoint faults for `scripts/chaos/chaos.py --checkpoint-faults`: a torn checkpoint and a full disk, in one real run.

    python scripts/chaos/chaos.py --checkpoint-faults                    # the disk fills up through the test hook
    python scripts/chaos/chaos.py --checkpoint-faults 4                  # a checkpoint every 4 steps (24 steps)
    python scripts/chaos/chaos.py --checkpoint-faults --disk-full tmpfs  # a real size-limited tmpfs (needs root)

One `sr1 run` of the tiny preset, a checkpoint every `c` steps (2 by default), `5c` steps, two launches:
1. disk-full: once step_2c is written, the disk fills up: step_3c fails and training goes on, step_4c fails too and
   the learner stops; `sr1 run` must exit with 74 (EXIT_CHECKPOINT_FAILED) and say how much space the next
   checkpoint needs, and no partial files may be left.
2. torn-checkpoint: space is freed, and every file of step_2c (the last good checkpoint) over 4 kB is cut to half its
   size, as a node that died while the files were copied or synced leaves them. The run is resumed: the learner must
   skip step_2c, naming it, load step_c, generate again the groups trained since, and finish.
(`tests/integration/test_learner_resume.py` tears a checkpoint after a SIGKILL, as issue 41 met it; the order here
needs one launch less than a kill, a tear and a separate full disk, for the same two faults.)
The disk fills up either through the checkpoint writer's test hook (`SR1TEST_DISK_FULL`: its own writes raise
ENOSPC; no privileges needed, what CI runs) or for real: `<run_dir>/checkpoints` is a tmpfs of `--tmpfs-mb` and a
ballast file takes its free space (root with CAP_SYS_ADMIN only). Both are checked by the audit, `verify` in base.py
(complete, nothing lost or trained twice, versions only go up, bound held, no orphans) and by `CheckpointFaults`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.chaos.base import ChaosRun, Verdict, run_overrides, verify  # noqa: E402

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
    left_after_stop: list[str]  # what `checkpoints/` held after the stop (no partial directory)

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
        if set(self.left_after_stop) != {"latest", f"step_{every}", self.torn}:
            problems.append(
                f"checkpoints/ held {self.left_after_stop} after the stop, not step_{every} and {self.torn}"
            )
        if self.failed_in_a_row != 2:  # the step that stopped the run logs its row too
            problems.append(f"checkpoint/failed_in_a_row peaked at {self.failed_in_a_row}, not 2")
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


def latest_checkpoint(run_dir: Path) -> int:
    """The version of the newest complete checkpoint (`checkpoints/latest`; 0 before the first)."""
    try:
        return int((run_dir / "checkpoints" / "latest").read_text().strip().split("_")[1])
    except (OSError, IndexError, ValueError):
        return 0


def _wait_latest(chaos: ChaosRun, version: int, timeout_s: float = 900) -> None:
    chaos.wait(lambda: latest_checkpoint(chaos.run_dir) == version, timeout_s, f"checkpoint step_{version}")


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
    """One run of `5 * every` steps: a full disk stops it, then its last good checkpoint is torn before the resume
    (see the module's docstring)."""
    steps, good = 5 * every, 2 * every
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    disk = DiskFull(run_dir, disk_full, tmpfs_mb)
    chaos = ChaosRun(run_dir, run_overrides(steps, every, max_staleness), env=disk.env)
    published: list[int] = []
    torn = run_dir / "checkpoints" / f"step_{good}"
    try:
        # 1. disk-full: once step_2c is written, the next two saves fail and the learner stops
        _wait_latest(chaos, good)
        _freeze_learner(chaos, signal.SIGSTOP)  # the fault lands before the next save whatever the step time
        published.append(chaos.version() or 0)  # read while the run's Redis is up
        disk.fill()
        _freeze_learner(chaos, signal.SIGCONT)
        print(f"disk full after {torn.name} ({disk_full})", flush=True)
        stop_code = chaos.finish()
        stop_message = chaos.log_path(chaos.launches - 1).read_text()
        left = sorted(p.name for p in torn.parent.iterdir() if p.name != disk.ballast.name)
        # 2. torn-checkpoint: space freed, the last good checkpoint cut to half, resumed
        disk.free()
        print(f"tearing {torn.name}: {', '.join(tear(torn))}", flush=True)
        chaos.resume()
        stopped_at = 4 * every  # the version the stop published: the resume goes on after it
        chaos.wait(lambda: (chaos.version() or 0) > stopped_at, 900, f"a version after {stopped_at}")
        published.append(chaos.version() or 0)
        returncode = chaos.finish()
    finally:
        chaos.kill_everything_left()
        disk.close()
    starts = [
        json.loads(x) for x in (run_dir / "learner_groups.jsonl").read_text().splitlines() if '"start"' in x
    ]
    resumed = starts[-1]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    faults = CheckpointFaults(
        torn=torn.name,
        skipped=[f"{s['checkpoint']}: {s['why']}" for s in resumed.get("skipped", [])],
        fell_back_to=int(resumed["weights"]),
        stop_code=stop_code,
        stop_message=stop_message,
        failed_in_a_row=int(max(r.get("checkpoint/failed_in_a_row", 0) for r in rows)),
        left_after_stop=left,
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`chaos.py`'s options for the checkpoint faults."""
    parser.add_argument(
        "--checkpoint-faults",
        type=int,
        nargs="?",
        const=2,
        default=None,
        metavar="EVERY",
        help="a torn checkpoint, then a full disk, in one run of 6*EVERY steps with a checkpoint every EVERY "
        "steps (default 2; scripts/chaos/chaos_checkpoints.py)",
    )
    parser.add_argument(
        "--disk-full",
        choices=["hook", "tmpfs"],
        default="hook",
        help="how the disk fills up: the checkpoint writer's ENOSPC test hook, or a real tmpfs (needs root)",
    )
    parser.add_argument(
        "--tmpfs-mb", type=int, default=512, help="the size of the tmpfs of --disk-full tmpfs"
    )


def chaos_main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`chaos.py --checkpoint-faults`: the run, its audit and its report; the exit status (`parser` for the
    signature the other fault kinds share: nothing here needs checking beyond argparse's own types)."""
    every = args.checkpoint_faults
    verdict, faults = run_checkpoint_faults(
        args.out / f"checkpoint-faults-{time.strftime('%Y%m%d-%H%M%S')}",
        every=every,
        max_staleness=args.max_staleness,
        disk_full=args.disk_full,
        tmpfs_mb=args.tmpfs_mb,
    )
    return report(verdict, faults, every)
