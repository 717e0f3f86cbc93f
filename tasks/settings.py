"""The `task` config section: which RL task the system runs, and that task's own knobs.

A family of variants on `type` (`common/variants.py`; one member per task), so a task's fields sit with it and a
field of another task fails at load time. Each member builds its own task (`build(retrieval)`, which imports the
task its `implementation` names only then, so this module stays data only). Adding a task: its folder under `tasks/`, its member here
and its line in `TASKS`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from common.imports import import_object
from common.variants import Family

if TYPE_CHECKING:
    from tasks.base import Task


class TaskSettings(BaseModel):
    """Base of every member of the `task` family: its tag, and how it makes its task."""

    model_config = ConfigDict(extra="forbid")

    # the `tasks.base.Task` that implements it, by import path: imported when built (the task's folder imports these
    # settings, and loads its own libraries)
    implementation: ClassVar[str] = ""

    type: str = Field(description="Which task (the union's tag).")

    def build(self, retrieval: Any = None) -> Task:
        """The task these settings describe (its `from_config`); `retrieval` (a RetrievalConfig) is where a task
        that searches finds its server."""
        if not self.implementation:
            raise NotImplementedError(f"{type(self).__name__} names no implementation to build")
        return import_object(self.implementation).from_config(self, retrieval)


class SearchR1Config(TaskSettings):
    """Search-R1: answer a question, searching a retrieval server with `<search>` as often as needed."""

    implementation: ClassVar[str] = "tasks.search_r1:SearchR1Task"

    type: Literal["search_r1"] = Field("search_r1", description="Which task (the union's tag).")
    reward: Literal["em", "f1", "format_em", "substring_em"] = Field(
        "em", description="Reward: Search-R1 exact match, token F1, format-aware EM (v0.3) or substring EM."
    )
    structure_format_score: float = Field(
        0.2,
        ge=0,
        le=1,
        description="format_em: reward of a well-formed trajectory with a wrong answer; a correct but malformed one "
        "gets 1 minus this (Search-R1 v0.3's name and value).",
    )
    final_format_score: float = Field(
        0.1,
        ge=0,
        le=1,
        description="format_em: reward of a malformed trajectory with a wrong answer (Search-R1 v0.3).",
    )
    retrieval_score: float = Field(
        0.0,
        ge=0,
        le=1,
        description="format_em: added to a well-formed wrong answer when a gold answer appears in a retrieved "
        "<information> block (Search-R1 v0.3; 0 in its scripts).",
    )
    reward_function: str | None = Field(
        None,
        description="Your own reward, as `package.module:function`, called as fn(transcript, ground_truth) -> float "
        "for every finished trajectory; it replaces `reward` (EM, F1 and substring EM are still reported).",
    )
    extra_data_sources: list[str] = Field(
        default_factory=list,
        description="data_source names the dataset readers accept beyond Search-R1's seven and the tiny world's "
        "(a row naming any other source is refused, so a typo cannot become a source of its own).",
    )

    @field_validator("reward_function")
    @classmethod
    def _import_path(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[\w.]+:[\w.]+", value):
            raise ValueError(f"reward_function must look like package.module:function, got {value!r}")
        return value


# the task family, chosen by `task.type`; the first member is the default. Adding a task: its folder, its member
# above (naming it as `implementation`) and its line here.
TASKS = Family(TaskSettings, tag="type", section="task", noun="task")
for _member in (SearchR1Config,):
    TASKS.register(_member)
TaskConfig = TASKS.choice
