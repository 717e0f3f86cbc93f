"""Rank 0's prompts come from the entry point (`sr1/entrypoints/learner.py`): `run_learner` has no loader of its own."""

import pytest
import torch

from learner.distributed import World
from learner.job import LearnerJob
from learner.loop import run_learner


def test_rank0_without_prompts_is_an_error_before_anything_starts(tmp_path):
    job = LearnerJob(run_dir=tmp_path)
    world = World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
    with pytest.raises(ValueError, match="rank 0 needs the training prompts"):
        run_learner(job, world)
    assert not any(tmp_path.iterdir())  # no model loaded, no checkpoint directory, no metrics written
