"""`build_task` makes the task class of every member of the `task` union, and refuses any other config."""

from __future__ import annotations

import types
from typing import get_args

import pytest

from retrieval.settings import RetrievalConfig
from tasks import TASKS, build_task
from tasks.search_r1 import SearchR1Task
from tasks.settings import TaskConfig

union = get_args(TaskConfig)[0]  # Annotated[A | B, Field(...)] -> A | B, or A alone while there is one task
MEMBERS = get_args(union) if isinstance(union, types.UnionType) else (union,)


def test_every_task_of_the_union_builds_its_class():
    expected = {"search_r1": SearchR1Task}
    assert set(TASKS) == set(MEMBERS)
    for member in MEMBERS:
        assert type(build_task(member())) is expected.pop(member().type), member
    assert not expected


def test_an_unknown_task_config_fails_naming_the_known_ones():
    with pytest.raises(TypeError, match="no task is built from RetrievalConfig; known tasks: search_r1"):
        build_task(RetrievalConfig())
