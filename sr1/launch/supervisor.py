"""The one process supervisor: `sr1 run`, the generator pool and the learner pool start their processes through it.

    sup = Supervisor()
    sup.start(Child("retrieval", python_module("sr1.entrypoints.retrieval", "serve", ...), run_dir / "logs" / "retrieval.log",
                    restart=RestartPolicy()))
    sup.check()                         # restarts a dead child with back-off; raises ChildFailed (with the end of its
                                        # log) for a child without a policy, past its restart budget, or that exited
                                        # with a status in NOT_RESTARTED (the same again: see there)
    sup.stop(["learner", "generator", "retrieval"])   # in that order: SIGINT, then SIGTERM, then SIGKILL

Each child runs in its own session and process group (Ctrl-C in the terminal reaches only the parent, which stops
its children in order) and gets SIGKILL from the kernel when its parent dies (Linux `PR_SET_PDEATHSIG`), so a
killed parent never leaves orphans behind. Stopping signals the whole group, also after its leader exited (vLLM's
engine core and model worker live in the group of the process that started them); a child's group is cleared the
same way before it is restarted.

A child that must not be cut short says so (`Child.busy`: the learner while it writes a checkpoint, common/busy.py):
a stop then waits past the child's grace for as long as it is busy (up to `busy_limit_s`), and `AFTER_BUSY_S` more
for it to exit, before SIGTERM.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from common.processes import die_with_parent
from config import EXIT_BAD_INPUT, EXIT_CHECKPOINT_FAILED

log = logging.getLogger("sr1.launch")

AFTER_BUSY_S = 30.0  # past a stop's grace, how long a child that was busy has to exit once it no longer is

# exit statuses a restart cannot help with: the same input, or the same full disk, fails the same way again
NOT_RESTARTED = {
    EXIT_BAD_INPUT: "stopped on a configuration or data error",
    EXIT_CHECKPOINT_FAILED: "stopped because its checkpoints cannot be written",
}


class ChildFailed(RuntimeError):
    """A child process exited while it was expected to be running (`exit_code`: its exit status, when known)."""

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        self.exit_code = exit_code


def free_port() -> int:
    """A TCP port that is free on the loopback interface right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prepare_child(cpus: tuple[int, ...] | None) -> None:
    """In a child before exec: no blocked signals, die with the parent, run on `cpus` only (when given).

    A child inherits its starter's blocked-signal mask, and a Ray actor blocks SIGINT: a part started by one would
    never see the Ctrl-C that asks it to checkpoint and stop."""
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    die_with_parent()
    if cpus:
        os.sched_setaffinity(0, cpus)


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def tail(path: Path, lines: int = 20) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass(frozen=True)
class RestartPolicy:
    """Restart a child that exits with a non-zero code: after `backoff_s`, doubled for each restart within
    `window_s` (at most `max_backoff_s`); more than `max_restarts` within the window is a failure."""

    max_restarts: int = 5
    window_s: float = 600.0
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0


@dataclass
class Child:
    """One supervised process: its command, its log file (stdout and stderr), extra environment, and what to do when
    it dies (`restart`: a policy, or None for "the run fails"; `restart_cmd`: the command of a restart, e.g. with
    `--resume`)."""

    name: str
    cmd: list[str]
    log_path: Path | None = None  # None: inherit the parent's stdout/stderr
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    restart: RestartPolicy | None = None
    restart_cmd: list[str] | None = None
    pass_fds: tuple[int, ...] = ()  # file descriptors the child inherits (the run lock: held while it lives)
    restarts: list[float] = field(default_factory=list)  # monotonic times of this child's restarts
    restart_at: float | None = None  # when a scheduled restart is due
    gang: str | None = None  # children of one gang (the ranks of a learner) die and restart together
    cpus: tuple[int, ...] | None = None  # Linux: the cores it (and every process it starts) may run on
    # what it is busy with that a stop must wait for (a checkpoint being written), or None; asked once its grace is over
    busy: Callable[[], str | None] | None = None
    busy_limit_s: float = 3600.0  # the longest a stop waits past the grace while the child says it is busy

    def start(self) -> Child:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(f"start {self.name} from the main thread: it would die when this thread ends")
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        out = None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it for its lifetime
        try:
            self.process = subprocess.Popen(
                self.cmd,
                stdout=out,
                stderr=subprocess.STDOUT if out is not None else None,
                env=env,
                start_new_session=True,  # its own process group: stopped as a whole
                preexec_fn=partial(_prepare_child, self.cpus),
                pass_fds=self.pass_fds,
            )
        finally:
            if out is not None:
                out.close()
        return self

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def failure(self) -> str:
        """What to tell a user about this child's exit: its code and the end of its log."""
        where = f" ({self.log_path})" if self.log_path else ""
        last = tail(self.log_path, 25) if self.log_path else "(output not captured)"
        return f"{self.name} exited with code {self.returncode}; last log lines{where}:\n{last}"

    def check(self) -> None:
        """Raise ChildFailed with the end of the log if the process has exited."""
        if self.process is not None and self.process.poll() is not None:
            raise ChildFailed(self.failure())

    def send(self, sig: int) -> None:
        """Signal the child's whole process group (also after the leader exited: its helpers may live on)."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def group_alive(self) -> bool:
        """Whether any process of the child's group is still there."""
        if self.process is None:
            return False
        self.process.poll()  # reap the leader if it exited
        try:
            os.killpg(self.process.pid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def stop(self, grace_s: float = 30.0, first: int = signal.SIGINT) -> int | None:
        """Ask politely (`first`), then SIGTERM, then SIGKILL the whole process group; returns the exit code. Past
        `grace_s`, a child that says it is busy (`busy`) is waited for while it is, and `AFTER_BUSY_S` after."""
        if self.process is None:
            return None
        for sig, wait_s in ((first, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            if not self.group_alive():
                break
            self.send(sig)
            deadline = time.monotonic() + wait_s
            while self.group_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            if sig == first and sig != signal.SIGKILL:
                self._wait_while_busy(deadline + self.busy_limit_s)
        return self.process.poll()

    def _wait_while_busy(self, limit: float) -> None:
        """After the grace: wait while the child says it is busy (until `limit`), then `AFTER_BUSY_S` for it to exit."""
        if self.busy is None:
            return
        said = False
        exit_by = 0.0  # once it is no longer busy: how long it has to exit
        while self.group_alive() and time.monotonic() < limit:
            doing = self.busy()
            if doing is not None:
                if not said:
                    log.warning("%s is still busy past its stop grace: waiting for %s", self.name, doing)
                said = True
                exit_by = time.monotonic() + AFTER_BUSY_S
            elif time.monotonic() >= exit_by:
                return
            time.sleep(0.2)


@dataclass
class Event:
    """Something the supervisor did or saw: a child died, or was restarted."""

    time: float  # time.time()
    child: str
    kind: str  # "died", "restarted"
    detail: str = ""


class Supervisor:
    """The children of one launcher, started in order, restarted by their policy, stopped in a given order."""

    def __init__(self, pass_fds: tuple[int, ...] = ()) -> None:
        self.children: list[Child] = []
        self.events: list[Event] = []
        self.stopping = False
        self.pass_fds = pass_fds  # given to every child it starts (the run lock)

    def start(self, child: Child) -> Child:
        child.pass_fds = tuple(dict.fromkeys(child.pass_fds + self.pass_fds))
        self.children.append(child.start())
        return child

    def adopt(self, child: Child) -> Child:
        """Look after a child that is already running (started by someone else, e.g. `LocalRedis`)."""
        self.children.append(child)
        return child

    def named(self, prefix: str) -> list[Child]:
        return [c for c in self.children if c.name.startswith(prefix)]

    def check(self, skip: Iterable[Child] = ()) -> list[Child]:
        """Look after the children (not in `skip`): a child that exited with a non-zero code is restarted by its
        policy (after its back-off: call `check` again, every second or so); one without a policy, or past its
        budget, raises ChildFailed. Returns the children restarted by this call."""
        skipped = list(skip)
        restarted = []
        for child in self.children:
            if (
                self.stopping
                or any(child is s for s in skipped)
                or child.alive
                or child.returncode in (None, 0)
            ):
                continue
            if child.restart is None:
                raise ChildFailed(child.failure(), child.returncode)
            if child.returncode in NOT_RESTARTED:
                raise ChildFailed(
                    f"{child.name} {NOT_RESTARTED[child.returncode]} (exit status {child.returncode}); not "
                    f"restarting it. " + child.failure(),
                    child.returncode,
                )
            if child.restart_at is None:
                for member in self._gang_of(child):
                    self._schedule_restart(member, cause=child)
            elif time.monotonic() >= child.restart_at:
                child.restart_at = None
                child.restarts.append(time.monotonic())
                if child.restart_cmd is not None:
                    child.cmd = child.restart_cmd
                child.start()
                self.events.append(Event(time.time(), child.name, "restarted", f"pid {child.pid}"))
                log.warning("restarted %s (pid %d)", child.name, child.pid)
                restarted.append(child)
        return restarted

    def _gang_of(self, child: Child) -> list[Child]:
        if child.gang is None:
            return [child]
        return [c for c in self.children if c.gang == child.gang]

    def _schedule_restart(self, child: Child, cause: Child) -> None:
        policy = child.restart
        if policy is None:
            raise ChildFailed(cause.failure())
        code = child.returncode
        if child is cause:
            self.events.append(Event(time.time(), child.name, "died", f"exit code {code}"))
        child.stop(
            grace_s=0.0, first=signal.SIGKILL
        )  # what is left of its group (engine processes) goes first
        now = time.monotonic()
        recent = [t for t in child.restarts if now - t < policy.window_s]
        if len(recent) >= policy.max_restarts:
            raise ChildFailed(
                f"{child.name} died {len(recent) + 1} times within {policy.window_s:.0f}s; not restarting it again. "
                + child.failure()
            )
        delay = min(policy.backoff_s * 2 ** len(recent), policy.max_backoff_s)
        child.restart_at = now + delay
        why = f"exited with code {code}" if child is cause else f"is restarted with {cause.name}"
        log.warning(
            "%s %s; restarting it in %.1fs (%s)",
            child.name,
            why,
            delay,
            tail(child.log_path, 1) if child.log_path else "",
        )

    def wait_until(
        self, predicate: Callable[[], bool], *, timeout_s: float, what: str, interval_s: float = 0.2
    ) -> None:
        """Poll `predicate` until true; fail early (with its log) if a child dies meanwhile."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check()
            if predicate():
                return
            time.sleep(interval_s)
        raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")

    def stop(self, order: Iterable[str] = (), grace_s: dict[str, float] | None = None) -> None:
        """Stop the children whose names start with each prefix of `order` in turn, then all the others."""
        self.stopping = True
        grace_s = grace_s or {}
        done: list[Child] = []
        for prefix in [*order, ""]:
            for child in self.named(prefix):
                if all(child is not d for d in done):
                    child.stop(grace_s=grace_s.get(prefix, 20.0))
                    done.append(child)


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            return response.status == 200
    except OSError:
        return False
