"""The learner learns through the real buffer and loss: reward for sampling a target token rises quickly."""

from __future__ import annotations

import json

import numpy as np
import pytest


@pytest.mark.timeout(300)
def test_reward_rises_through_the_buffer(tiny_model_dir, redis_url, tmp_path):
    import torch

    from config import load_config
    from fakes.groups import toy_prompts
    from learner.distributed import init_distributed, shutdown_distributed
    from learner.loop import run_learner
    from tests.fakes.toy_generator import ToyGenerator

    steps = 24
    config = load_config(
        "tiny",
        [
            f"model.path={tiny_model_dir}",
            f"run_dir={tmp_path / 'run'}",
            "buffer.namespace=learn",
            "generators.group_size=8",
            "learner.groups_per_step=4",
            "learner.max_staleness=1",
            f"learner.total_steps={steps}",
            "learner.lr=5e-3",
            "learner.warmup_steps=0",
            "learner.micro_batch_tokens=512",
            "learner.checkpoint_every=1000",
            "learner.num_engines=0",
        ],
    )
    targets = set(
        range(0, 64)
    )  # ~12% of the vocabulary: the untrained policy hits it about one time in eight
    generator = ToyGenerator(
        redis_url, "learn", group_size=8, targets=targets, model_dir=tiny_model_dir, seed=0
    ).start()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    world = init_distributed("cpu")
    try:
        job = config.learner_job().model_copy(
            update={"buffer": config.buffer.model_copy(update={"redis_url": redis_url})}
        )
        version = run_learner(job, world, prompts=toy_prompts(200), weight_sink=generator.load_weights)
    finally:
        generator.stop()
        shutdown_distributed()
        torch.set_num_threads(threads)
    assert version == steps
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    lines = [m for m in rows if "step" in m]  # not the segment marker
    rewards = [m["batch/reward_mean"] for m in lines]
    assert [m["learner/version"] for m in lines] == list(range(1, steps + 1))
    assert max(m["staleness/max"] for m in lines) <= 1
    first, last = np.mean(rewards[:4]), np.mean(rewards[-4:])
    assert first < 0.4 and last > first + 0.3, rewards
