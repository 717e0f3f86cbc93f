"""Checkpoints of an FSDP learner on 2 gloo ranks: each rank writes and checksums its own shards, rank 0 renames the
directory once every rank has written its part; a full disk on one rank fails the save on both (partial files
removed, the checkpoint before intact); a torn shard of one rank is found at resume by the rank that checks it, and
both ranks fall back to the same older checkpoint."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest


def _rank_main(rank: int, world_size: int, port: int, model_dir: str, tmp: str) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    tmp_path = Path(tmp)
    trigger = tmp_path / "disk-full"
    if rank == 1:  # only rank 1's disk fills up
        os.environ["SR1TEST_DISK_FULL"] = str(trigger)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    from fakes.groups import random_groups
    from learner.checkpoints.checkpointer import Checkpointer, CheckpointWriteError, ResumeState
    from learner.checkpoints.files import read_manifest
    from learner.distributed import init_distributed, shutdown_distributed
    from learner.settings import LearnerConfig
    from learner.trainer import Learner

    world = init_distributed("cpu")
    cfg = LearnerConfig(groups_per_step=2, micro_batch_tokens=512)
    learner = Learner(cfg, model_dir, world, seed=0)
    learner.train_step(random_groups(np.random.default_rng(0), n_groups=2, group_size=2, version=0))
    ckpt = Checkpointer(tmp_path / "checkpoints", world, Path(model_dir), keep=3)

    def save(version: int) -> Path:
        return ckpt.save(learner.model, learner.optimizer, learner.scheduler, ResumeState(version=version))

    out: dict = {"first": sorted(read_manifest(save(1))[0])}
    if rank == 0:
        trigger.write_text("")
    dist.barrier()
    try:
        save(2)
        out["second"] = "written"
    except CheckpointWriteError as err:
        out["second"] = [str(err), err.no_space]
    dist.barrier()
    out["second"].append(sorted(p.name for p in ckpt.root.iterdir()))
    if rank == 0:
        trigger.unlink()
    dist.barrier()  # the space is back on every rank before the next save reads the hook
    third = save(3)
    if rank == 0:
        shard = third / "resume" / "dcp" / "__1_0.distcp"  # written by rank 1
        os.truncate(shard, shard.stat().st_size - 1)
    dist.barrier()
    fresh = Learner(cfg, model_dir, world, seed=1)
    resumed = ckpt.resume(fresh.model, fresh.optimizer, fresh.scheduler)
    out["resumed"] = [resumed.path.name, resumed.skipped]
    (tmp_path / f"rank{rank}.json").write_text(json.dumps(out))
    shutdown_distributed()


@pytest.mark.timeout(300)
def test_two_ranks_write_verify_and_fall_back_together(tiny_model_dir, tmp_path, free_port):
    import torch.multiprocessing as mp

    mp.spawn(_rank_main, args=(2, free_port, str(tiny_model_dir), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    files = ranks[0]["first"]
    assert {"resume/rng_rank0.pt", "resume/rng_rank1.pt", "model.safetensors", "resume/state.json"} <= set(
        files
    )
    assert {"resume/dcp/__0_0.distcp", "resume/dcp/__1_0.distcp"} <= set(files)
    for out in ranks:
        message, no_space, left = out["second"]
        assert no_space and "rank 1: OSError: [Errno 28] No space left on device" in message
        assert left == ["latest", "step_1"]  # no step_2, no partial directory
        name, skipped = out["resumed"]
        assert name == "step_1" and skipped[0][0] == "step_3"
        assert "resume/dcp/__1_0.distcp has" in skipped[0][1] and "cut short" in skipped[0][1]
