"""RL tasks: what a prompt is, how a model turn is read, what the tool answers, what a trajectory is worth.

    task = build_task(config.task, retrieval=config.retrieval)

The agent loop, the engines, the buffer and the learner are the same for every task; `tasks/base.py` is the
contract, and each task is one folder (`tasks/search_r1/`) plus one member of the `task` config union
(`tasks/settings.py`).
"""

from __future__ import annotations

from typing import Any

from tasks.base import Action, DataError, Observation, Score, Task, Transcript
from tasks.settings import TaskConfig

__all__ = ["Action", "DataError", "Observation", "Score", "Task", "TaskConfig", "Transcript", "build_task"]


def build_task(cfg: TaskConfig, retrieval: Any = None) -> Task:
    """The task `cfg` (a member of the `task` union) names; `retrieval` (a RetrievalConfig) is where tasks that
    search find their server."""
    from common.imports import import_object

    return import_object(cfg.implementation).from_config(cfg, retrieval)
