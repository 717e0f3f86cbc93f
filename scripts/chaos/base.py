"""What every chaos run shares: the `sr1 run` under test, the verdict read from what it leaves behind, when to inject.

The driver (`chaos.py`) and each kind of fault (`chaos_checkpoints.py`, `chaos_faults.py`, `chaos_freeze.py`,
`chaos_network.py`) import this module; it imports none of them, so the chaos scripts import each other in one
direction only:

    chaos.py -> chaos_checkpoints, chaos_faults, chaos_freeze, chaos_network -> base.py

`ChaosRun` starts and watches one `sr1 run` (and kills its parts); `verify` checks what survived it (`Verdict`);
`injection_steps` spaces the kills or faults over a run; `freeze` stops processes for a while and always lets them go.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import redis

ROOT = Path(__file__).resolve().parents[2]  # where `sr1 run` starts

PARTS = ("generator", "learner", "redis", "retrieval", "parent")
# the module each part runs (sr1/entrypoints/), found in its command line
PART_MODULES = {
    "generator": "sr1.entrypoints.generators",
    "learner": "sr1.entrypoints.learner",
    "retrieval": "sr1.entrypoints.retrieval",
}


@dataclass
class Recovery:
    part: str
    at_version: int
    new_process_s: float
    next_version_s: float


@dataclass
class Verdict:
    completed: bool
    steps: int
    lost: int
    trained_twice: int
    versions_increase: bool
    max_staleness_seen: int
    max_staleness: int
    orphans: list[str] = field(default_factory=list)
    dead_lettered: int = (
        0  # released prompts that left for good with a reason (not lost: counted and replaced)
    )

    @property
    def ok(self) -> bool:
        return (
            self.completed
            and not self.lost
            and not self.trained_twice
            and self.versions_increase
            and self.max_staleness_seen <= self.max_staleness
            and not self.orphans
        )


class ChaosRun:
    """One `sr1 run` of `preset` (the tiny one by default; `tiny-lora` trains LoRA adapters) in `run_dir`, with the
    means to kill its parts and to watch it."""

    def __init__(
        self, run_dir: Path, overrides: list[str], env: dict[str, str] | None = None, preset: str = "tiny"
    ):
        self.run_dir = run_dir
        self.seen: set[int] = set()  # every process of the run ever seen
        self.launches = 0
        self.env = {**os.environ, **(env or {})}
        self.parent = self._launch(preset, *overrides, "--run-dir", str(run_dir))

    def _launch(self, *args: str) -> subprocess.Popen:
        log = open(self.log_path(self.launches), "w")  # noqa: SIM115
        self.launches += 1
        cmd = [sys.executable, "-m", "sr1", "run", *args, "--no-live"]
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True, env=self.env
        )

    def log_path(self, launch: int) -> Path:
        """The output of the `launch`-th `sr1 run` of this run (0: the first)."""
        return self.run_dir.parent / f"{self.run_dir.name}-sr1-run-{launch}.log"

    def resume(self) -> None:
        """`sr1 run --resume` on the run directory (the previous stack has exited)."""
        self.parent = self._launch("--resume", str(self.run_dir))

    def version(self) -> int | None:
        """The published version, read through the run's own Redis (None while it is down)."""
        try:
            client = redis.Redis.from_url(
                (self.run_dir / "redis" / "url").read_text().strip(),
                socket_timeout=1,
                socket_connect_timeout=1,
            )
            value = client.get("sr1:version")
            client.close()
            return int(value or 0)
        except (OSError, redis.RedisError, ValueError):
            return None

    def processes(self, part: str) -> list[psutil.Process]:
        if part == "redis":  # redis-server sets its own process title: `redis-server 127.0.0.1:<port>`
            needle, scope = (
                # host:port (after the user and password, which the run's Redis has)
                (self.run_dir / "redis" / "url").read_text().strip().split("/")[2].rpartition("@")[2],
                "",
            )
        else:
            needle, scope = PART_MODULES.get(part, ""), str(self.run_dir)
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            argv = proc.info["cmdline"] or []
            if part == "redis":
                named = any(needle in arg for arg in argv)
            elif needle:
                # a module is matched as a whole argument (`-m sr1.entrypoints.retrieval`), never as a part of
                # another one (an override or a path on sr1 run's own command line)
                named = needle in argv
            else:  # "parent": every process naming the run directory
                named = True
            if named and scope in " ".join(argv):
                found.append(proc)
        return found

    def _watch(self) -> None:
        try:
            root = psutil.Process(self.parent.pid)
            self.seen |= {root.pid} | {c.pid for c in root.children(recursive=True)}
        except psutil.NoSuchProcess:
            pass

    def wait(self, predicate, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._watch()
            if predicate():
                return
            if self.parent.poll() is not None:
                raise RuntimeError(f"sr1 run exited with {self.parent.returncode} while waiting for {what}")
            time.sleep(0.25)
        raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")

    def kill(self, part: str, at_step: int) -> Recovery:
        """SIGKILL `part` once the run has published `at_step`; return how long the run took to recover."""
        self.wait(lambda: (self.version() or 0) >= at_step, 900, f"version {at_step}")
        at = self.version()
        started = time.monotonic()
        if part == "parent":
            self.kill_parent()
            self.resume()
        else:
            (victim,) = self.processes(part)
            victim.send_signal(signal.SIGKILL)
            self.wait(
                lambda: [p.pid for p in self.processes(part)] not in ([], [victim.pid]),
                120,
                f"a new {part} process",
            )
        new_process_s = time.monotonic() - started
        self.wait(lambda: (self.version() or 0) > at, 900, f"training to go on after the {part} died")
        return Recovery(part, at, new_process_s, time.monotonic() - started)

    def kill_parent(self) -> None:
        """SIGKILL `sr1 run` (a dead terminal) and wait until every process of its stack is gone."""
        self.parent.send_signal(signal.SIGKILL)
        self.parent.wait(10)
        old = self.seen - {self.parent.pid}  # every child dies with it, and with them the run lock
        deadline = time.monotonic() + 30
        while alive(old) and time.monotonic() < deadline:
            time.sleep(0.25)

    def finish(self, timeout_s: float = 900) -> int:
        deadline = time.monotonic() + timeout_s
        while self.parent.poll() is None and time.monotonic() < deadline:
            self._watch()
            time.sleep(0.25)
        if self.parent.poll() is None:
            raise TimeoutError(f"the run did not finish within {timeout_s:.0f}s")
        return self.parent.returncode

    def kill_everything_left(self) -> None:
        for proc in self.processes("parent"):  # every process naming the run directory
            proc.kill()


def freeze(processes: list[psutil.Process], seconds: float, chaos: ChaosRun) -> None:
    """SIGSTOP every process, wait `seconds` (watching the run), SIGCONT them whatever happened meanwhile."""
    for proc in processes:
        proc.send_signal(signal.SIGSTOP)
    thaw_at = time.monotonic() + seconds
    try:
        chaos.wait(lambda: time.monotonic() >= thaw_at, seconds + 5, "the end of a freeze")
    finally:
        for proc in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGCONT)


def alive(pids: set[int]) -> list[int]:
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.NoSuchProcess:
            pass
    return found


def surviving_steps(run_dir: Path) -> list[dict]:
    """learner_groups.jsonl without the steps a later learner process threw away (it resumed from older weights)."""
    kept: list[dict] = []
    for line in (run_dir / "learner_groups.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "start" in record:
            kept = [s for s in kept if s["version"] <= record["weights"]]
        else:
            kept.append(record)
    return kept


def verify(chaos: ChaosRun, returncode: int, steps: int, max_staleness: int, published: list[int]) -> Verdict:
    from buffer.group_ids import RELEASED_RECORD, released_group_ids
    from sr1.launch.redis_server import LocalRedis

    time.sleep(1.0)
    orphans = [" ".join(psutil.Process(p).cmdline())[:120] for p in alive(chaos.seen)]
    run_dir = chaos.run_dir
    history = surviving_steps(run_dir)
    versions = [s["version"] for s in history]
    trained = [gid for s in history for gid in s["group_ids"]]
    with LocalRedis(run_dir / "redis") as server:  # the run stopped its Redis: read the AOF it left
        client = redis.Redis.from_url(server.url)
        released = released_group_ids(client, "sr1", run_dir / RELEASED_RECORD)  # Redis forgets old ones
        pending = {g.decode() for g in client.zrange("sr1:inflight", 0, -1)}
        histogram = {int(k): int(v) for k, v in client.hgetall("sr1:staleness").items()}
        dead = {fields.get(b"gid", b"").decode() for _, fields in client.xrange("sr1:dead")} & released
        client.close()
    return Verdict(
        completed=returncode == 0 and bool(versions) and versions[-1] == steps,
        steps=versions[-1] if versions else 0,
        lost=len(released - set(trained) - pending - dead) + len(set(trained) - released),
        dead_lettered=len(dead),
        trained_twice=len(trained) - len(set(trained)) + len(set(trained) & pending),
        versions_increase=versions == sorted(set(versions)) and published == sorted(published),
        max_staleness_seen=max(histogram, default=0),
        max_staleness=max_staleness,
        orphans=orphans,
    )


def run_overrides(steps: int, checkpoint_every: int, max_staleness: int) -> list[str]:
    """The tiny preset as the chaos runs use it: short evaluations at the start and end only, 30 s leases."""
    return [
        f"learner.total_steps={steps}",
        f"learner.checkpoint_every={checkpoint_every}",
        f"learner.max_staleness={max_staleness}",
        "eval.max_prompts=8",
        "eval.every_steps=0",
        "buffer.lease_s=30",
    ]


def injection_steps(count: int, steps: int, seed: int, first_step: int, spacing: int) -> list[int]:
    """The versions at which `count` kills or faults are injected into a run of `steps`: one every `spacing` steps
    from `first_step`, each one step later or not (`seed` picks)."""
    rng = random.Random(seed)
    at_steps = [first_step + spacing * i + rng.randint(0, 1) for i in range(count)]
    if at_steps and at_steps[-1] >= steps:
        raise ValueError(
            f"{count} injections need more than {steps} steps (the last lands at {at_steps[-1]})"
        )
    return at_steps


def chosen(value: str, known: tuple[str, ...], what: str, parser: argparse.ArgumentParser) -> list[str]:
    """The names in a comma-separated option (`--parts`, `--faults`, `--network`); an unknown one is a usage error."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    if unknown := sorted(set(names) - set(known)):
        parser.error(f"unknown {what}(s) {unknown}; choose from {', '.join(known)}")
    return names
