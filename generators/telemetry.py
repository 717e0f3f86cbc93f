"""What a generator worker reports: its counts, rates and idle time, sent to the buffer as its heartbeat.

    telemetry = WorkerTelemetry(engine, tools)
    telemetry.count_inflight(+n)        # a group's n trajectories start; count_inflight(-1) as each finishes
    telemetry.group_put(group, rollouts)
    beat = telemetry.metrics(inflight_groups=2, weight_sync_state="joined:3", state="running")
    await heartbeat_loop(buffer, "gen-0", worker.metrics, every_s=5.0)      # until cancelled

The parts of the worker count into one `WorkerTelemetry` (claims: trajectories, groups and tool calls; evaluation
answering: its errors); the keys it reports are listed in docs/metrics-pools.md ("Generator worker heartbeat").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from buffer.records import Group
from buffer.redis_buffer import ReplayBuffer
from generators.agent import Rollout
from generators.engine_updates import initial_update_stats
from generators.tool_health import ToolHealth

log = logging.getLogger(__name__)

ROLE = "generator"  # the role a generator worker heartbeats as


class WorkerTelemetry:
    """A worker's counts since it started, the time its engine had no trajectory to run, and the heartbeat's
    metrics built from them."""

    def __init__(self, engine: Any, tools: ToolHealth):
        self.engine = engine
        self.tools = tools
        self.started = time.monotonic()
        self.inflight_trajectories = 0
        self._idle_s = 0.0  # time with no trajectory in flight (the engine had no rollout work)
        self._idle_since: float | None = self.started
        self.tool_calls = 0
        self.groups_done = 0
        self.trajectories_done = 0
        self.groups_failed = 0
        # groups that finished with tool errors while paused: given back, sampled again once the tool answers
        self.groups_given_back = 0
        self.eval_errors = 0  # evaluation requests answered with an error record
        self.finish_reasons: Counter[str] = Counter()
        self._recent: deque[tuple[float, int, float, int]] = deque(
            maxlen=4096
        )  # (time, turns, reward, tool calls)
        self._rate_marks: deque[tuple[float, int, int]] = deque(maxlen=64)  # (time, tokens, tool calls)

    def count_inflight(self, delta: int) -> None:
        """Track trajectories in flight and the time the engine spent with none (its idle fraction)."""
        now = time.monotonic()
        if self.inflight_trajectories == 0 and delta > 0 and self._idle_since is not None:
            self._idle_s += now - self._idle_since
            self._idle_since = None
        self.inflight_trajectories += delta
        if self.inflight_trajectories == 0 and self._idle_since is None:
            self._idle_since = now

    def group_put(self, group: Group, rollouts: list[Rollout]) -> None:
        """A group went into the buffer: count it, its trajectories and how each ended."""
        now = time.monotonic()
        for traj, rollout in zip(group.trajectories, rollouts, strict=True):
            self.finish_reasons[rollout.finish_reason] += 1
            self._recent.append((now, rollout.turns, traj.reward, rollout.tool_calls))
        self.groups_done += 1
        self.trajectories_done += len(rollouts)

    def idle_seconds(self, now: float) -> float:
        """Seconds since the worker started with no trajectory in flight."""
        return self._idle_s + (now - self._idle_since if self._idle_since is not None else 0.0)

    def idle_fraction(self, now: float) -> float:
        return self.idle_seconds(now) / max(now - self.started, 1e-9)

    def metrics(self, *, inflight_groups: int, weight_sync_state: str, state: str) -> dict[str, Any]:
        """The heartbeat's metrics; the caller says what only it knows (groups held, weight sync, its state)."""
        now = time.monotonic()
        tokens = int(getattr(self.engine, "tokens_generated", 0))
        self._rate_marks.append((now, tokens, self.tool_calls))
        # rates over the last ~30 s of heartbeats
        while len(self._rate_marks) > 2 and now - self._rate_marks[0][0] > 30:
            self._rate_marks.popleft()
        t0, tok0, s0 = self._rate_marks[0]
        dt = max(now - t0, 1e-9)
        recent = [r for r in self._recent if now - r[0] <= 60]
        out: dict[str, Any] = {
            "rollout/tokens_per_s": (tokens - tok0) / dt if len(self._rate_marks) > 1 else 0.0,
            "rollout/tool_calls_per_s": (self.tool_calls - s0) / dt if len(self._rate_marks) > 1 else 0.0,
            "rollout/inflight_trajectories": self.inflight_trajectories,
            "rollout/inflight_groups": inflight_groups,
            "rollout/groups_done": self.groups_done,
            "rollout/groups_failed": self.groups_failed,
            "rollout/trajectories_done": self.trajectories_done,
            "rollout/tokens_total": tokens,
            "rollout/tool_calls_total": self.tool_calls,
            # over the trajectories this worker finished in the last 60 s
            "rollout/turns_mean_60s": sum(r[1] for r in recent) / len(recent) if recent else 0.0,
            "rollout/reward_mean_60s": sum(r[2] for r in recent) / len(recent) if recent else 0.0,
            "rollout/tool_calls_per_traj_60s": sum(r[3] for r in recent) / len(recent) if recent else 0.0,
            "rollout/version": int(getattr(self.engine, "version", 0)),
            "rollout/uptime_s": now - self.started,
            "rollout/idle_fraction": self.idle_fraction(now),
            # cumulative, so that a reader can take the busy share between any two heartbeats (sr1 plan --from-run)
            "rollout/busy_s": now - self.started - self.idle_seconds(now),
            "rollout/weight_sync_state": weight_sync_state,
            "rollout/groups_given_back": self.groups_given_back,
            "rollout/eval_errors": self.eval_errors,
            "rollout/state": state,
            **self.tools.metrics(now),
            # the last weight update's pause of this engine's decoding, and the probe check (generators/adapters.py)
            **(getattr(self.engine, "update_stats", None) or initial_update_stats()),
        }
        for reason, count in self.finish_reasons.items():
            out[f"rollout/finish/{reason}"] = count
        return out


async def heartbeat_loop(
    buffer: ReplayBuffer, worker_id: str, metrics: Callable[[], dict[str, Any]], every_s: float
) -> None:
    """Send `metrics()` as this worker's heartbeat every `every_s` until cancelled; a failed one is logged."""
    while True:
        try:
            await asyncio.to_thread(buffer.heartbeat, worker_id, ROLE, metrics())
        except Exception as exc:
            log.warning("heartbeat failed: %s", exc)
        await asyncio.sleep(every_s)
