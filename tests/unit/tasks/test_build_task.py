"""`build_task` makes the task class of every member of the `task` family, and refuses any other config."""

from __future__ import annotations

import pytest

from retrieval.settings import RetrievalConfig
from tasks import TASKS, build_task
from tasks.search_r1 import SearchR1Task


def test_every_task_of_the_union_builds_its_class():
    expected = {"search_r1": SearchR1Task}
    assert list(TASKS.members) == ["search_r1"]
    for member in TASKS.members.values():
        assert type(build_task(member())) is expected.pop(member().type), member
    assert not expected


def test_an_unknown_task_config_fails_naming_the_known_ones():
    with pytest.raises(TypeError, match="no task is built from RetrievalConfig; known tasks: search_r1"):
        build_task(RetrievalConfig())
