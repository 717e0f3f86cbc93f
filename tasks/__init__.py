"""RL tasks: what a prompt is, how a model turn is read, what the tool answers, what a trajectory is worth.

    task = build_task(config.task, retrieval=config.retrieval)

The agent loop, the engines, the buffer and the learner are the same for every task; `tasks/base.py` is the
contract. Adding a task is its folder (`tasks/search_r1/`), its member of the `task` config union
(`tasks/settings.py`) and its line in `TASKS` below.
"""

from __future__ import annotations

from typing import Any

from tasks.base import Action, DataError, Observation, Score, Task, Transcript
from tasks.search_r1 import SearchR1Task
from tasks.settings import SearchR1Config, TaskConfig

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

# each member of the `task` union and the class `build_task` makes of it (with its `from_config`)
TASKS: dict[type, type[Task]] = {SearchR1Config: SearchR1Task}


def build_task(cfg: TaskConfig, retrieval: Any = None) -> Task:
    """The task of `cfg` (a member of the `task` union); `retrieval` (a RetrievalConfig) is where tasks that search
    find their server. TypeError naming the known tasks for any other config."""
    cls = TASKS.get(type(cfg))
    if cls is None:
        known = ", ".join(member.model_fields["type"].default for member in TASKS)
        raise TypeError(f"no task is built from {type(cfg).__name__}; known tasks: {known}")
    return cls.from_config(cfg, retrieval)
