"""A generator worker's job: the sections one generator process uses (`common/jobs.py` says how jobs are made)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from buffer.settings import BufferConfig
from common.jobs import Job
from common.sections import DataConfig, EvalConfig, ModelConfig
from generators.settings import GeneratorsConfig
from retrieval.settings import RetrievalConfig
from tasks.settings import SearchR1Config, TaskConfig


class GeneratorJob(Job):
    """One generator worker: a vLLM engine, the agent loop of the task, the buffer, evaluation requests."""

    job: Literal["generator"] = "generator"
    worker_id: str = Field("gen-0", description="Consumer name in Redis.")
    engine_index: int = Field(0, ge=0, description="Engine number in the pool (offsets the sampling seed).")
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=SearchR1Config)
    generators: GeneratorsConfig = Field(default_factory=GeneratorsConfig)
    retrieval: RetrievalConfig = Field(
        default_factory=RetrievalConfig, description="The client side: url, ..."
    )
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    data: DataConfig = Field(default_factory=DataConfig, description="test_files answer evaluation requests.")
    eval: EvalConfig = Field(default_factory=EvalConfig)
