"""A malformed trajectory info from another writer never stops the learner: the tool figures it spoils are left out
of the step's metrics, with a warning naming its group (a malformed heartbeat: buffer/stats.py skips it)."""

from __future__ import annotations

import logging
import math

from fakes.groups import make_group, toy_prompts
from learner.steps import tool_metrics


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
