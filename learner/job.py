"""The learner ranks' job: the sections a learner process uses (`common/jobs.py` says how jobs are made)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from buffer.settings import BufferConfig
from common.jobs import Job
from common.sections import DataConfig, EvalConfig, ModelConfig
from learner.settings import LearnerConfig
from tasks.settings import SearchR1Config, TaskConfig
from weight_sync.settings import WeightSyncConfig


class LearnerJob(Job):
    """The learner ranks: prompt feeding and batches (rank 0), training, weight publishing, checkpoints."""

    job: Literal["learner"] = "learner"
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=SearchR1Config, description="Reads the training prompts.")
    data: DataConfig = Field(default_factory=DataConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    weight_sync: WeightSyncConfig = Field(default_factory=WeightSyncConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    temperature: float = Field(
        1.0, gt=0, description="The generators' sampling temperature (log-probs match)."
    )
    max_response_tokens: int | None = Field(
        None,
        ge=1,
        description="The generators' response token budget (DAPO's overlong shaping measures from it).",
    )
    num_engines: int = Field(1, ge=0, description="Engines that receive the weights after every step.")
