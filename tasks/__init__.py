"""RL tasks: what a prompt is, how a model turn is read, what the tool answers, what a trajectory is worth.

    task = build_task(config.task, retrieval=config.retrieval)

The agent loop, the engines, the buffer and the learner are the same for every task; `tasks/base.py` is the
contract. Adding a task is its folder (`tasks/search_r1/`) and its member of the `task` family (`tasks/settings.py`,
registered in `TASKS` there), which builds the task.
"""

from __future__ import annotations

from typing import Any

from tasks.base import Action, DataError, Observation, Score, Task, Transcript
from tasks.settings import TASKS, TaskConfig, TaskSettings

__all__ = [
    "TASKS",
    "Action",
    "DataError",
    "Observation",
    "Score",
    "Task",
    "TaskConfig",
    "Transcript",
    "build_task",
]


def build_task(cfg: TaskConfig, retrieval: Any = None) -> Task:
    """The task of `cfg` (a member of the `task` family); `retrieval` (a RetrievalConfig) is where tasks that search
    find their server. TypeError naming the known tasks for any other config."""
    if not isinstance(cfg, TaskSettings) or TASKS.members.get(cfg.type) is not type(cfg):
        raise TypeError(f"no task is built from {type(cfg).__name__}; known tasks: {TASKS.known()}")
    return cfg.build(retrieval)
