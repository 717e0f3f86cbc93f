"""The `task` config section: which RL task the system runs, and that task's own knobs.

A discriminated union on `type` (one member per task), so a task's fields sit with it and a field of another task
fails at load time. Each member names its task class (`implementation`), which `tasks.build_task` builds with
`from_config(cfg, retrieval)`. Adding a task: its folder under `tasks/` plus one member here.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field


class SearchR1Config(BaseModel):
    """Search-R1: answer a question, searching a retrieval server with `<search>` as often as needed."""

    model_config = ConfigDict(extra="forbid")
    implementation: ClassVar[str] = "tasks.search_r1:SearchR1Task"  # built by tasks.build_task

    type: Literal["search_r1"] = Field("search_r1", description="Which task (the union's tag).")
    reward: Literal["em", "f1", "format_em", "substring_em"] = Field(
        "em", description="Reward: Search-R1 exact match, token F1, format-aware EM (v0.3) or substring EM."
    )


TaskConfig = Annotated[SearchR1Config, Field(discriminator="type")]
