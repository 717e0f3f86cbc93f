"""The typed config of each process: the sections it uses and nothing else.

    job = cfg.learner_job()                     # from the root Config (config/schema.py)
    save_job(job, run_dir / "jobs" / "learner.yaml")
    job = load_job(LearnerJob, "runs/x/jobs/learner.yaml", ["learner.lr=1e-5"])

Launchers (`sr1 run`, `sr1 generators`, `sr1 learner`) write one job file per process into `<run_dir>/jobs/` and start
the process with it. A process also accepts a preset or a root config file (`--config qwen2.5-3b-8xh100`, as under
torchrun): `load_job` then resolves the root config and takes the job from it, so both ways end in the same typed
value. Values shared by several processes are copied into each job by the root config (`learner_job()` copies the
generators' sampling temperature, token budget and the number of engines), never read from another process's section.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from buffer.settings import BufferConfig
from config.sections import DataConfig, EvalConfig, LoggingConfig, ModelConfig
from generators.settings import GeneratorsConfig
from learner.settings import LearnerConfig
from retrieval.settings import RetrievalConfig
from tasks.settings import SearchR1Config, TaskConfig
from weight_sync.settings import WeightSyncConfig


class _Job(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int = Field(0, description="The run's seed.")
    run_dir: Path = Field(Path("runs/tiny"), description="Where the run writes everything.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Metrics and logs.")


class GeneratorJob(_Job):
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


class LearnerJob(_Job):
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


class RetrievalJob(_Job):
    """The retrieval server (every worker process of it)."""

    job: Literal["retrieval"] = "retrieval"
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)


JOB_KINDS: dict[str, type[_Job]] = {
    "generator": GeneratorJob,
    "learner": LearnerJob,
    "retrieval": RetrievalJob,
}
