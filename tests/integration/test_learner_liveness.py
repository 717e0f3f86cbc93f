"""The learner loop never waits for what cannot come and never trains on what it cannot use: a real overlong group is
dead-lettered and replaced under synchronous training (max_staleness 0), and a run of non-finite steps stops the run
before a checkpoint is written. Against a real Redis, the tiny model and the stand-in generator pool
(tests/fakes/toy_generator.py)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.timeout(300)

GROUPS_PER_STEP = 2


def _job(tiny_model_dir, redis_url, tmp_path, namespace: str, *overrides: str):
    from config import load_config

    config = load_config(
        "tiny",
        [
            f"model.path={tiny_model_dir}",
            f"run_dir={tmp_path / 'run'}",
            f"buffer.namespace={namespace}",
            "generators.group_size=2",
            f"learner.groups_per_step={GROUPS_PER_STEP}",
            "learner.max_staleness=0",
            "learner.warmup_steps=0",
            "learner.num_engines=0",
            "eval.every_steps=0",
            *overrides,
        ],
    )
    return config.learner_job().model_copy(
        update={"buffer": config.buffer.model_copy(update={"redis_url": redis_url})}
    )


def _run(job, generator, steps_prompts: int = 200):
    import torch

    from fakes.groups import toy_prompts
    from learner.distributed import init_distributed, shutdown_distributed
    from learner.loop import run_learner

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    world = init_distributed("cpu")
    try:
        return run_learner(job, world, prompts=toy_prompts(steps_prompts), weight_sink=generator.load_weights)
    finally:
        generator.stop()
        shutdown_distributed()
        torch.set_num_threads(threads)


def test_an_overlong_group_is_dead_lettered_and_replaced_under_sync_training(
    tiny_model_dir, redis_url, tmp_path
):
    from buffer.redis_buffer import ReplayBuffer
    from tests.fakes.toy_generator import ToyGenerator

    steps = 3
    job = _job(
        tiny_model_dir,
        redis_url,
        tmp_path,
        "live-overlong",
        f"learner.total_steps={steps}",
        "learner.micro_batch_tokens=512",
        "learner.checkpoint_every=1000",
    )
    # every third question is padded to 600 tokens: more than one micro-batch (512) can hold
    generator = ToyGenerator(
        redis_url, "live-overlong", group_size=2, targets={1}, overlong_every=3, overlong_tokens=600
    ).start()
    assert _run(job, generator) == steps
    rows = [json.loads(x) for x in (tmp_path / "run" / "learner_groups.jsonl").read_text().splitlines()]
    trained = [gid for r in rows if "group_ids" in r for gid in r["group_ids"]]

    def index(gid: str) -> int:
        return int(gid.split("/")[2])

    assert len(trained) == steps * GROUPS_PER_STEP and all(index(gid) % 3 for gid in trained)
    buf = ReplayBuffer(redis_url, "live-overlong")
    stats = buf.stats()
    dead = buf.dead_letters()
    buf.close()
    assert (
        stats["buffer/untrainable"] >= 1 and stats["buffer/abandoned_groups"] == stats["buffer/untrainable"]
    )
    assert dead and all(index(d["gid"]) % 3 == 0 for d in dead)
    assert "trajectory 0 has 601 tokens (600 prompt + 1 response)" in dead[0]["reason"]
    assert "learner.micro_batch_tokens (512)" in dead[0]["reason"]


def test_non_finite_steps_in_a_row_stop_the_run_before_a_checkpoint(
    tiny_model_dir, redis_url, tmp_path, monkeypatch
):
    from learner.steps import NONFINITE_KEY, NonFiniteTrainingError
    from learner.trainer import Learner
    from tests.fakes.toy_generator import ToyGenerator

    real_step = Learner.train_step

    # the first step is finite; every later one is skipped as non-finite
    def train_step(self, groups, bounds=None):
        metrics = real_step(self, groups, bounds)
        return metrics | {NONFINITE_KEY: 1.0 if self.version > 1 else 0.0}

    monkeypatch.setattr(Learner, "train_step", train_step)
    job = _job(
        tiny_model_dir,
        redis_url,
        tmp_path,
        "live-nan",
        "learner.total_steps=10",
        "learner.checkpoint_every=1",
        "learner.max_nonfinite_steps=2",
    )
    generator = ToyGenerator(redis_url, "live-nan", group_size=2, targets={1}).start()
    with pytest.raises(NonFiniteTrainingError) as err:
        _run(job, generator)
    message = str(err.value)
    assert "the step at version 2 skipped its update" in message and "2 step(s) in a row" in message
    assert "learner.max_nonfinite_steps=2" in message and "toy/train/" in message
    # the good step and the first skipped one were checkpointed; nothing after the second skipped step
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*"))
    assert checkpoints[-1] == "step_2"
