"""Progress of one long phase (building the world, starting an engine, an evaluation): what it is, how far it got
and about how long is left, visible however the program runs.

    with PhaseProgress("warm start", total=1500, unit="steps") as phase:
        for _ in range(1500):
            ...
            phase.advance()
    with PhaseProgress("starting the vLLM engine", expected_s=25):   # no count: an estimate from a typical time
        wait_for_engine()

In a terminal: a rich progress bar (description, bar, count, elapsed, time left). Without one (a log file, CI, a
pipe): one plain line at least every `interval_s` (10 s), from a background thread, so a phase whose work gives no
updates for a while still says it is alive, then a last line when it ends:

    [warm start] 500/1500 steps (33%), 41 s elapsed, about 82 s left
    [starting the vLLM engine] 20 s elapsed, about 5 s left (it usually takes about 25 s)
    [warm start] done: 1500 steps in 121 s

The time left comes from the rate so far when there is a count, else from `expected_s`.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

INTERVAL_S = 10.0  # the longest a phase stays silent without a terminal


def format_seconds(seconds: float) -> str:
    """`42 s`, `3 min 5 s`."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    return f"{seconds // 60} min {seconds % 60} s"


class PhaseProgress:
    """A progress bar in a terminal, a line every `interval_s` without one (see the module docstring)."""

    def __init__(
        self,
        name: str,
        *,
        total: int | None = None,
        unit: str = "",
        expected_s: float | None = None,
        interval_s: float = INTERVAL_S,
        stream: TextIO | None = None,
        terminal: bool | None = None,
        enabled: bool = True,
        printer: Callable[[str], None] | None = None,
        clock: Any = time.monotonic,
        report_done: bool = True,
        announce: bool = False,
    ):
        self.name, self.total, self.unit, self.expected_s = name, total, unit, expected_s
        self.interval_s = interval_s
        self.stream = stream if stream is not None else sys.stdout
        self.terminal = self.stream.isatty() if terminal is None else terminal
        self.enabled = enabled
        self.printer = printer  # how a plain line is printed (default: to `stream`)
        self.clock = clock
        # False where the caller reports the phase's time itself (a step of a larger phase that says its own time
        # once): no closing line then, so no phase's time is printed twice
        self.report_done = report_done
        # True: a first line at once without a terminal (phases of a few seconds in a row would otherwise chain
        # their silences past `interval_s`)
        self.announce = announce
        self.completed = 0
        self.note = ""  # a short extra field shown after the count (e.g. the loss)
        self.started = clock()
        self._bar: Any = None
        self._task: Any = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # -- what a line says ------------------------------------------------------------------------------------------

    def elapsed_s(self) -> float:
        return self.clock() - self.started

    def remaining_s(self) -> float | None:
        """Seconds left: from the rate so far when there is a count, else from `expected_s`; None if unknown."""
        elapsed = self.clock() - self.started
        if self.total and self.completed > 0:
            return elapsed / self.completed * (self.total - self.completed)
        if self.expected_s is not None:
            return max(0.0, self.expected_s - elapsed)
        return None

    def line(self) -> str:
        """The plain progress line, e.g. `[warm start] 500/1500 steps (33%), 41 s elapsed, about 82 s left`."""
        elapsed = self.clock() - self.started
        parts = []
        if self.total:
            count = f"{self.completed}/{self.total}{' ' + self.unit if self.unit else ''}"
            parts.append(f"{count} ({100 * self.completed / self.total:.0f}%)")
        elif self.completed:
            parts.append(f"{self.completed}{' ' + self.unit if self.unit else ''}")
        if self.note:
            parts.append(self.note)
        parts.append(f"{format_seconds(elapsed)} elapsed")
        left = self.remaining_s()
        if left is not None:
            if left > 0 or self.total:
                parts.append(f"about {format_seconds(left)} left")
            else:
                parts.append("taking longer than usual")
            if not self.total and self.expected_s is not None:
                parts[-1] += f" (it usually takes about {format_seconds(self.expected_s)})"
        return f"[{self.name}] " + ", ".join(parts)

    # -- updates ---------------------------------------------------------------------------------------------------

    def update(self, *, completed: int | None = None, advance: int = 0, note: str | None = None) -> None:
        with self._lock:
            if completed is not None:
                self.completed = completed
            self.completed += advance
            if note is not None:
                self.note = note
        if self._bar is not None:
            self._bar.update(self._task, completed=self.completed, note=self.note)

    def advance(self, steps: int = 1, note: str | None = None) -> None:
        self.update(advance=steps, note=note)

    def _print(self, text: str) -> None:
        if self.printer is not None:
            self.printer(text)
        else:
            print(text, file=self.stream, flush=True)

    def _tick(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                text = self.line()
            self._print(text)

    # -- the phase ---------------------------------------------------------------------------------------------------

    def __enter__(self) -> PhaseProgress:
        if not self.enabled:
            return self
        self.started = self.clock()
        if self.terminal:
            self._start_bar()
        else:
            if self.announce:
                self._print(self.line())
            self._ticker = threading.Thread(target=self._tick, name=f"progress:{self.name}", daemon=True)
            self._ticker.start()
        return self

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        columns: list[Any] = [TextColumn("{task.description}"), BarColumn()]
        if self.total:
            columns += [
                MofNCompleteColumn(),
                TextColumn(self.unit),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
            ]
        else:
            # no count: the bar fills over the expected time, so the remaining column shows the estimate
            columns += [TimeElapsedColumn(), TextColumn("{task.fields[estimate]}")]
        columns.append(TextColumn("{task.fields[note]}"))
        self._bar = Progress(*columns, console=Console(file=self.stream), transient=False)
        self._bar.start()
        self._task = self._bar.add_task(self.name, total=self.total, note=self.note, estimate="")
        if not self.total:
            self._follow_expected()

    def _follow_expected(self) -> None:
        """Without a count, a thread keeps the bar's estimate column current."""

        def follow() -> None:
            while not self._stop.wait(1.0):
                left = self.remaining_s()
                estimate = "" if left is None else (f"about {format_seconds(left)} left" if left > 0 else "")
                self._bar.update(self._task, estimate=estimate)

        self._ticker = threading.Thread(target=follow, name=f"progress:{self.name}", daemon=True)
        self._ticker.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.enabled:
            return
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        elapsed = self.clock() - self.started
        if self._bar is not None:
            if self.total and exc_type is None:
                self._bar.update(self._task, completed=self.total)
            self._bar.stop()
            return
        if exc_type is None:
            if self.report_done:
                count = f"{self.completed}{' ' + self.unit if self.unit else ''} " if self.total else ""
                self._print(f"[{self.name}] done: {count}in {format_seconds(elapsed)}")
        else:
            self._print(f"[{self.name}] stopped after {format_seconds(elapsed)}")
