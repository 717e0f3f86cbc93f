"""A malformed record from another writer (a trajectory's info, a worker's heartbeat) never stops the learner: the
figures it spoils are left out of the step's metrics, with a warning naming where it came from."""

from __future__ import annotations

import logging
import math

import pytest

from buffer.redis_buffer import open_buffer
from buffer.settings import BufferConfig
from buffer.stats import pool_metrics
from learner.steps import RankSteps, StepHooks, tool_metrics
from tests.fakes.groups import make_group, toy_prompts


def _group(index: int, infos: list):
    prompt = toy_prompts(index + 1)[index]
    group = make_group(prompt, n=len(infos), prompt_len=4, response_len=8)
    for trajectory, info in zip(group.trajectories, infos, strict=True):
        trajectory.info = info
    return group


def test_malformed_trajectory_infos_are_left_out_of_the_tool_figures(caplog):
    good = {"tool_calls": 2, "tool_errors": 1, "tool_seconds": 0.5}
    groups = [
        _group(0, [good, {"tool_calls": "two"}, {"tool_calls": None}]),
        _group(1, [good, {"tool_seconds": math.nan}, ["not", "a", "dict"], {"tool_errors": -1}]),
        _group(2, [{"em": 1.0}]),  # no tool figures at all: no call (not malformed)
    ]
    with caplog.at_level(logging.WARNING, logger="learner.steps"):
        metrics = tool_metrics(groups)
    assert metrics == {
        "tools/calls": 4.0,
        "tools/errors": 2.0,
        "tools/error_rate": 0.5,
        "tools/latency_s": 0.25,
    }
    warning = caplog.text
    assert (
        groups[0].group_id in warning and groups[1].group_id in warning and groups[2].group_id not in warning
    )


class _PoolHooks(StepHooks):
    """Rank 0's pool figures as `StepCoordinator.step_metrics` reads them: the workers' heartbeats from Redis."""

    def __init__(self, buffer):
        self.buffer = buffer

    def step_metrics(self) -> dict:
        return pool_metrics(self.buffer.workers())


@pytest.mark.parametrize("metrics", [{"rollout/version": "v3"}, {"rollout/tokens_per_s": "fast"}, "a string"])
def test_a_malformed_heartbeat_leaves_the_pool_figures_out_of_the_step(redis_url, caplog, metrics):
    buffer = open_buffer(BufferConfig(redis_url=redis_url, namespace="malformed"))
    buffer.heartbeat("gen-0", "generator", {"rollout/version": 3, "rollout/tokens_per_s": 10.0})
    buffer.heartbeat("gen-1", "generator", metrics)  # another writer's heartbeat (an older or broken sr1)
    with caplog.at_level(logging.WARNING, logger="learner.steps"):
        assert RankSteps._own_metrics(_PoolHooks(buffer), 7) == {}
    assert "left out of step 7" in caplog.text
    buffer.heartbeat("gen-1", "generator", {"rollout/version": 4})  # well-formed again: the figures are back
    assert RankSteps._own_metrics(_PoolHooks(buffer), 8)["pool/generators"] == 2
