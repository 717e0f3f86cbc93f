"""The `task` config section: which RL task the system runs, and that task's own knobs.

A discriminated union on `type` (one member per task), so a task's fields sit with it and a field of another task
fails at load time. This module is data only: `tasks.build_task` (`tasks/__init__.py`) pairs each member with its
task class in `TASKS` and builds it with `from_config(cfg, retrieval)`. Adding a task: its folder under `tasks/`, its
member here (and in `TaskConfig`), and its line in `TASKS`.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class SearchR1Config(BaseModel):
    """Search-R1: answer a question, searching a retrieval server with `<search>` as often as needed."""

    model_config = ConfigDict(extra="forbid")

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


TaskConfig = Annotated[SearchR1Config, Field(discriminator="type")]
