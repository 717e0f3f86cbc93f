"""The retrieval server's job: every worker process of it (`common/jobs.py` says how jobs are made)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from common.jobs import Job
from retrieval.settings import RetrievalConfig


class RetrievalJob(Job):
    """The retrieval server (every worker process of it)."""

    job: Literal["retrieval"] = "retrieval"
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)
