"""The processes of a run, one entry point each: parse the command line, load the process's job (`config/`), run it.

    python -m sr1.entrypoints.learner --config JOB_OR_PRESET [overrides]      # one learner rank (torchrun -m too)
    python -m sr1.entrypoints.generators --config JOB_OR_PRESET [overrides]   # one generator worker
    python -m sr1.entrypoints.retrieval serve|build-index ...                 # `sr1 retrieval`

They sit in the top layer, above `config/`, so that the pools' packages never import the config: a pool defines its
job from its own settings (`learner/job.py`, `generators/job.py`, `retrieval/job.py`), `config/` composes the jobs
from the root config, and an entry point loads its job and hands it to the pool's code. Launchers (`sr1 run`,
`sr1 learner`, `sr1 generators`, `sr1 launch`) start these modules by the names below. Each answers `--help` without
importing torch or vLLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from common.jobs import Job

JobT = TypeVar("JobT", bound="Job")

LEARNER = "sr1.entrypoints.learner"
GENERATORS = "sr1.entrypoints.generators"
RETRIEVAL = "sr1.entrypoints.retrieval"


def load_pool_job(job_cls: type[JobT], config: str, overrides: list[str], redis_url: str | None) -> JobT:
    """The job of a pool's process: `--config` (a job file, a preset or a root config), the dotted overrides, then
    `--redis-url` as `buffer.redis_url`. ConfigError when it is invalid or names no Redis, where the pools meet."""
    # config/ imports the learner's settings, and with them torch: loaded here, not on the way to --help
    from config import ConfigError, load_job

    job = load_job(job_cls, config, [*overrides, *([f"buffer.redis_url={redis_url}"] if redis_url else [])])
    if not job.buffer.redis_url:
        raise ConfigError("no Redis URL: pass --redis-url or set buffer.redis_url")
    return job
