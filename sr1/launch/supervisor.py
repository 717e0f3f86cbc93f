"""Child processes of `sr1 run`: start each pool as its own process with a log file, wait until it is ready,
stop everything cleanly (SIGINT first so learners checkpoint, then SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


class ChildFailed(RuntimeError):
    """A child process exited while it was expected to be running."""


@dataclass
class Child:
    name: str
    cmd: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None

    def start(self) -> Child:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it for its lifetime
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        # own process group: Ctrl-C in the terminal reaches only `sr1 run`, which then stops children in order
        self.process = subprocess.Popen(
            self.cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()
        return self

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check(self) -> None:
        """Raise ChildFailed with the end of the log if the process has exited."""
        if self.process is not None and self.process.poll() is not None:
            raise ChildFailed(
                f"{self.name} exited with code {self.process.returncode}; last log lines ({self.log_path}):\n"
                + tail(self.log_path, 25)
            )

    def send(self, sig: int) -> None:
        if self.alive:
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace_s: float = 30.0, first: int = signal.SIGINT) -> int | None:
        """Ask politely (`first`), then SIGTERM, then SIGKILL the whole process group."""
        if self.process is None:
            return None
        for sig, wait_s in ((first, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            if not self.alive:
                break
            self.send(sig)
            try:
                self.process.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
        return self.process.poll()


def tail(path: Path, lines: int = 20) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def wait_until(predicate: Callable[[], bool], *, timeout_s: float, what: str, children: list[Child] = (),
               interval_s: float = 0.2) -> None:  # fmt: skip
    """Poll `predicate` until true; fail early (with its log) if any child dies meanwhile."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in children:
            child.check()
        if predicate():
            return
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            return response.status == 200
    except OSError:
        return False
