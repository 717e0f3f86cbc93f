"""What the set-up shows while it runs: each install step with about how long is left, and the tiny world that
`make run` builds beside the install (`sr1 world`), its lines relayed once the install is done.

Standard library only, like scripts/setup_env.py, which uses it: it runs before the venv exists.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from common.progress import format_seconds

ROOT = Path(__file__).resolve().parents[1]
INTERVAL_S = 10.0
# about how long each step takes on the project's 2-core VM with nothing cached (seconds; measured 2026-11-26,
# rounded up): the "time left" estimates
EXPECTED_S = {
    "uv": 3, "locate torch": 3, "uv install": 20, "uv base": 12, "uv extras": 10, "pip torch": 60,
    "pip install": 200,
}  # fmt: skip


@dataclass
class Plan:
    """The steps still to run and their expected durations: what "about N left" is computed from."""

    steps: list[str]
    expected_s: dict[str, float] = field(default_factory=lambda: dict(EXPECTED_S))
    done: int = 0

    def left_s(self, current: str, elapsed_in_current: float) -> float:
        later = self.steps[self.steps.index(current) + 1 :] if current in self.steps else []
        current_left = max(0.0, self.expected_s.get(current, 0) - elapsed_in_current)
        return current_left + sum(self.expected_s.get(s, 0) for s in later)


class Reporter:
    """One line per step and, while a step runs, a bar in a terminal or a line every `interval_s` without one."""

    def __init__(self, stream=None, *, terminal: bool | None = None, interval_s: float = INTERVAL_S):
        self.stream = stream if stream is not None else sys.stdout
        self.terminal = self.stream.isatty() if terminal is None else terminal
        self.interval_s = interval_s

    def say(self, text: str) -> None:
        print(f"[setup] {text}", file=self.stream, flush=True)

    def echo(self, line: str) -> None:
        """A line of another process (the world's build), as it is."""
        print(line, file=self.stream, flush=True)

    def status(self, plan: Plan, step: str, what: str, elapsed: float) -> str:
        number = plan.steps.index(step) + 1 if step in plan.steps else plan.done + 1
        left = plan.left_s(step, elapsed)
        return (
            f"[setup {number}/{len(plan.steps)}] {what}: {format_seconds(elapsed)} elapsed, "
            f"about {format_seconds(left)} left of the install" if left > 0 else
            f"[setup {number}/{len(plan.steps)}] {what}: {format_seconds(elapsed)} elapsed, taking longer than usual"
        )  # fmt: skip

    def bar(self, plan: Plan, step: str, what: str, elapsed: float, width: int = 24) -> str:
        total = sum(plan.expected_s.get(s, 0) for s in plan.steps) or 1.0
        left = plan.left_s(step, elapsed)
        filled = int(width * min(1.0, max(0.0, 1 - left / total)))
        return f"\r\033[K[{'#' * filled}{'.' * (width - filled)}] " + self.status(plan, step, what, elapsed)

    def run_step(self, plan: Plan, step: str, what: str, work: Callable[[], None]) -> None:
        """Run `work` while showing progress; the step's line first, its time when done."""
        self.say(f"{plan.steps.index(step) + 1 if step in plan.steps else '-'}/{len(plan.steps)} {what}")
        stop = threading.Event()
        start = time.monotonic()

        def tick() -> None:
            period = 1.0 if self.terminal else self.interval_s
            while not stop.wait(period):
                elapsed = time.monotonic() - start
                if self.terminal:
                    self.stream.write(self.bar(plan, step, what, elapsed))
                else:
                    self.stream.write(self.status(plan, step, what, elapsed) + "\n")
                self.stream.flush()

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            work()
        finally:
            stop.set()
            ticker.join()
            if self.terminal:
                self.stream.write("\r\033[K")
            plan.done += 1
        self.say(f"    {what}: {format_seconds(time.monotonic() - start)}")


# the world's closing line: built (with its time) or installed from the copy shipped in the package
CLOSING_MARKS = (" built in ", ": the shipped copy ")


class WorldBuild:
    """`sr1 world ARGS` in the background: the tiny world `make run ARGS=...` will train on, built while the
    install fetches what only the run needs. Its lines go to `log_path` while the install runs, so that one estimate
    is shown at a time (the install's); once the install is done, `wait` relays them (the world's own estimate,
    then its time, once). If it fails, `sr1 run` builds the world itself: nothing is lost."""

    def __init__(self, venv_python: str, args: Sequence[str], log_path: Path, *, terminal: bool = False):
        self.venv_python, self.args, self.log_path = venv_python, list(args), log_path
        self.terminal = terminal  # kept for callers; the world's lines go to the log either way
        self.proc: subprocess.Popen | None = None
        self._log = None
        self.started = 0.0

    def start(self, reporter: Reporter) -> None:
        cmd = [self.venv_python, "-m", "sr1", "world", *self.args]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in wait()
        reporter.say(
            f"the tiny world beside the install (seed 0's is shipped, other seeds are built): sr1 world "
            f"{' '.join(self.args)}".rstrip()
            + f" (its output: {self.log_path})"
        )
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)

    def wait(self, reporter: Reporter, poll_s: float = 0.5) -> bool:
        """Relay the build's progress lines until it ends (the latest one first); whether it succeeded."""
        if self.proc is None:
            return False
        proc = self.proc
        lines = self._progress_lines()
        if proc.poll() is not None:  # it ended during the install: only its closing line, with its time
            last = [line for line in lines if any(mark in line for mark in CLOSING_MARKS)][-1:]
        else:
            waited = format_seconds(time.monotonic() - self.started)
            reporter.say(f"the install is done; the tiny world has been building for {waited}:")
            if lines:  # where it stands (the earlier lines said the same with older figures)
                reporter.echo(lines[-1])
            shown = len(lines)
            while proc.poll() is None:
                time.sleep(poll_s)
                lines = self._progress_lines()
                for line in lines[shown:]:
                    reporter.echo(line)
                shown = len(lines)
            last = self._progress_lines()[shown:]
        for line in last:
            reporter.echo(line)
        if self._log is not None:
            self._log.close()
        if proc.returncode != 0:
            reporter.say(
                f"the tiny world's build failed (exit {proc.returncode}); `sr1 run` builds it instead "
                f"(its output: {self.log_path})"
            )
        return proc.returncode == 0

    def _progress_lines(self) -> list[str]:
        """The build's own lines so far (its `[...]` progress and closing lines; other libraries' output left out)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        complete = text[: text.rfind("\n") + 1]  # a half-written last line waits for the next poll
        return [line for line in complete.splitlines() if line.startswith("[") and "\r" not in line]
