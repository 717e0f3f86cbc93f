"""Whether a generator worker's tool (the retriever) is healthy enough to sample with, from its recent tool calls.

    health = ToolHealth(cfg.tool_pause)
    health.record(calls=3, errors=3, seconds=0.4)       # after each trajectory
    if health.paused: ...                               # claim nothing; probe the tool every probe_s
    health.resume()                                     # a probe succeeded

Trajectories sampled while the retriever is down see only "Search unavailable" observations: training on them teaches
the policy nothing about searching. Above `max_error_rate` over the last `window_s` (and at least `min_calls` calls)
the worker pauses and says why (heartbeat `rollout/state` = paused, `rollout/pause_reason`, a log line).
"""

from __future__ import annotations

import time
from collections import deque

from generators.settings import ToolPauseConfig


class ToolHealth:
    """Tool calls of the last `window_s` and the pause they cause; totals for the worker's metrics."""

    def __init__(self, cfg: ToolPauseConfig):
        self.cfg = cfg
        self._recent: deque[tuple[float, int, int, float]] = deque()  # (time, calls, errors, seconds)
        self._sums = [0, 0, 0.0]  # calls, errors, seconds over _recent (kept as entries come and go)
        self.calls_total = 0
        self.errors_total = 0
        self.seconds_total = 0.0
        self.pause_reason = ""  # empty while sampling
        self.pauses = 0

    @property
    def paused(self) -> bool:
        return bool(self.pause_reason)

    def _window(self, now: float) -> tuple[int, int, float]:
        """Calls, errors and seconds of the last `window_s` (the worker calls this for every trajectory: running
        sums, not a sum over the window)."""
        recent, sums = self._recent, self._sums
        while recent and now - recent[0][0] > self.cfg.window_s:
            _, calls, errors, seconds = recent.popleft()
            sums[0] -= calls
            sums[1] -= errors
            sums[2] -= seconds
        if not recent:
            sums[:] = [0, 0, 0.0]  # no rounding left over
        return sums[0], sums[1], sums[2]

    def record(self, calls: int, errors: int, seconds: float, now: float | None = None) -> bool:
        """Add one trajectory's tool calls; True if this pauses the worker (it was sampling until now)."""
        if not calls:
            return False
        now = time.monotonic() if now is None else now
        self._recent.append((now, calls, errors, seconds))
        self._sums[0] += calls
        self._sums[1] += errors
        self._sums[2] += seconds
        self.calls_total += calls
        self.errors_total += errors
        self.seconds_total += seconds
        if self.paused or not self.cfg.enabled:
            return False
        calls, errors, _ = self._window(now)
        if calls >= self.cfg.min_calls and errors > self.cfg.max_error_rate * calls:
            self.pause_reason = (
                f"{errors} of {calls} tool calls failed in the last {self.cfg.window_s:.0f} s "
                f"(generators.tool_pause.max_error_rate={self.cfg.max_error_rate})"
            )
            self.pauses += 1
            return True
        return False

    def resume(self) -> None:
        """A probe succeeded: sample again, judging only calls made from now on."""
        self.pause_reason = ""
        self._recent.clear()
        self._sums[:] = [0, 0, 0.0]

    def metrics(self, now: float | None = None) -> dict[str, float | str]:
        calls, errors, seconds = self._window(time.monotonic() if now is None else now)
        return {
            "rollout/tool_errors_total": self.errors_total,
            "rollout/tool_error_rate": errors / calls if calls else 0.0,
            "rollout/tool_latency_s": seconds / calls if calls else 0.0,
            "rollout/tool_pauses": self.pauses,
            "rollout/pause_reason": self.pause_reason,
        }
