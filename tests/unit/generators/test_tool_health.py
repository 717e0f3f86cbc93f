"""The tool-health window: its running sums equal the sums over the calls of the last `window_s`, as calls come in
and age out, and a burst of failures pauses sampling."""

from __future__ import annotations

import random

from generators.settings import ToolPauseConfig
from generators.tool_health import ToolHealth


def test_the_window_sums_follow_the_calls_that_are_still_in_it():
    cfg = ToolPauseConfig(enabled=True, max_error_rate=0.99, window_s=10.0, min_calls=1000)
    health, log, rng = ToolHealth(cfg), [], random.Random(0)
    for i in range(400):
        now = i * 0.25
        calls, errors, seconds = rng.randint(1, 4), rng.randint(0, 1), rng.random()
        health.record(calls, min(errors, calls), seconds, now=now)
        log.append((now, calls, min(errors, calls), seconds))
        inside = [r for r in log if now - r[0] <= cfg.window_s]
        calls_in, errors_in, seconds_in = health._window(now)
        assert (calls_in, errors_in) == (sum(r[1] for r in inside), sum(r[2] for r in inside))
        assert abs(seconds_in - sum(r[3] for r in inside)) < 1e-9
    assert health._window(now + cfg.window_s + 1) == (0, 0, 0.0)  # everything aged out: exactly zero


def test_failures_over_the_rate_pause_and_a_resume_forgets_them():
    health = ToolHealth(ToolPauseConfig(enabled=True, max_error_rate=0.5, window_s=30.0, min_calls=4))
    assert not health.record(2, 2, 0.1, now=0.0)  # too few calls to judge
    assert health.record(2, 2, 0.1, now=1.0) and health.paused
    assert "4 of 4 tool calls failed" in health.pause_reason
    health.resume()
    assert not health.paused and health._window(2.0) == (0, 0, 0.0)
    assert not health.record(4, 1, 0.1, now=2.0)
