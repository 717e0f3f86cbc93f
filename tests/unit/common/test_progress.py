"""A long phase says what it is, how far it got and about how long is left: lines without a terminal, a bar in one."""

from __future__ import annotations

import io
import time

from common.progress import PhaseProgress, format_seconds
from tests.timing import scaled


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_counted_phase_estimates_what_is_left_from_its_rate():
    clock = FakeClock()
    phase = PhaseProgress("warm start", total=1500, unit="steps", clock=clock, stream=io.StringIO())
    clock.now += 40
    phase.update(completed=500, note="loss 1.234")
    assert phase.remaining_s() == 80
    assert phase.line() == (
        "[warm start] 500/1500 steps (33%), loss 1.234, 40 s elapsed, about 1 min 20 s left"
    )


def test_a_phase_without_a_count_estimates_from_its_usual_time_and_says_when_it_runs_late():
    clock = FakeClock()
    phase = PhaseProgress("starting the vLLM engine", expected_s=25, clock=clock, stream=io.StringIO())
    clock.now += 20
    assert phase.line() == (
        "[starting the vLLM engine] 20 s elapsed, about 5 s left (it usually takes about 25 s)"
    )
    clock.now += 20
    assert "taking longer than usual" in phase.line()
    assert PhaseProgress("x", clock=clock, stream=io.StringIO()).remaining_s() is None


def test_without_a_terminal_a_line_comes_every_interval_even_without_updates_and_one_at_the_end():
    out = io.StringIO()
    with PhaseProgress("evaluation", expected_s=60, interval_s=0.05, stream=out, terminal=False):
        time.sleep(scaled(0.3))  # no update at all: the lines still come (one every 0.05 s)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3
    assert all(line.startswith("[evaluation] ") for line in lines)
    assert "elapsed" in lines[0] and "left" in lines[0]
    assert lines[-1].startswith("[evaluation] done: in ")


def test_a_failed_phase_says_it_stopped_and_a_disabled_one_prints_nothing():
    out = io.StringIO()
    try:
        with PhaseProgress("world", interval_s=60, stream=out, terminal=False):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert out.getvalue().startswith("[world] stopped after ")
    quiet = io.StringIO()
    with PhaseProgress("world", interval_s=0.01, stream=quiet, terminal=False, enabled=False) as phase:
        phase.advance()
        time.sleep(0.05)
    assert quiet.getvalue() == ""


def test_in_a_terminal_it_draws_a_bar_with_the_phase_name():
    out = io.StringIO()
    with PhaseProgress("warm start", total=4, unit="steps", stream=out, terminal=True) as phase:
        for _ in range(4):
            phase.advance()
    text = out.getvalue()
    assert "warm start" in text and "4/4" in text


def test_format_seconds():
    assert format_seconds(42.4) == "42 s"
    assert format_seconds(185) == "3 min 5 s"
    assert format_seconds(-3) == "0 s"


def test_a_step_of_a_larger_phase_announces_itself_and_leaves_the_time_to_its_caller():
    """The tiny world's steps: a first line at once (steps of a few seconds in a row are never silent together
    past the interval), no closing line (the world reports its time once, for all its steps)."""
    out = io.StringIO()
    with PhaseProgress(
        "warm start",
        total=2,
        unit="steps",
        interval_s=60,
        stream=out,
        terminal=False,
        announce=True,
        report_done=False,
    ) as phase:
        phase.advance(2)
    assert out.getvalue().splitlines() == ["[warm start] 0/2 steps (0%), 0 s elapsed"]
