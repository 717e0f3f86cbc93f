"""What every process's typed config (its job) has: the run's seed, its directory and logging.

Each role defines its own job next to its settings (`learner/job.py`, `generators/job.py`, `retrieval/job.py`): the
sections that process uses and nothing else. `config/` composes them from the root config (`Config.learner_job()`),
launchers write one job file per process into `<run_dir>/jobs/` (`config.save_job`), and each process's entry point
(`sr1/entrypoints/`) loads its job (`config.load_job`) and hands it to its pool's code, which never imports `config/`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from common.sections import LoggingConfig


class Job(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int = Field(0, description="The run's seed.")
    run_dir: Path = Field(Path("runs/tiny"), description="Where the run writes everything.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Metrics and logs.")
