"""The learner says it is checkpointing while it writes a checkpoint (issue #49): rank 0 keeps the run directory's
busy marker (common/busy.py) for exactly as long as a save lasts, so that a stop (Ctrl-C in `sr1 run`) waits for a
slow checkpoint past the learner's grace (tests/unit/sr1/launch/test_supervisor_busy.py). Against a real Redis, the
tiny model and the stand-in generator pool, with a save slowed by 2 s."""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SLOW_SAVE_S = 2.0


def test_rank_0_is_busy_exactly_while_a_checkpoint_is_written(
    tiny_model_dir, redis_url, tmp_path, monkeypatch
):
    import torch

    from common.busy import CHECKPOINTING, busy_with
    from config import load_config
    from fakes.groups import toy_prompts
    from learner.checkpoints.checkpointer import Checkpointer
    from learner.distributed import init_distributed, shutdown_distributed
    from learner.loop import run_learner
    from tests.fakes.toy_generator import ToyGenerator

    run_dir = tmp_path / "run"
    marker = run_dir / CHECKPOINTING
    seen: list[tuple[str | None, str | None]] = []  # (at the start of each save, at its end)
    real_save = Checkpointer.save

    def slow_save(self, model, optimizer, scheduler, state, *args, **kwargs):
        before = busy_with(marker)
        time.sleep(SLOW_SAVE_S)
        path = real_save(self, model, optimizer, scheduler, state, *args, **kwargs)
        seen.append((before, busy_with(marker)))
        return path

    monkeypatch.setattr(Checkpointer, "save", slow_save)
    config = load_config(
        "tiny",
        [
            f"model.path={tiny_model_dir}",
            f"run_dir={run_dir}",
            "buffer.namespace=busy",
            "generators.group_size=2",
            "learner.groups_per_step=2",
            "learner.total_steps=2",
            "learner.checkpoint_every=1",
            "learner.num_engines=0",
            "eval.every_steps=0",
        ],
    )
    job = config.learner_job().model_copy(
        update={"buffer": config.buffer.model_copy(update={"redis_url": redis_url})}
    )
    generator = ToyGenerator(redis_url, "busy", group_size=2, targets={1}).start()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    world = init_distributed("cpu")
    try:
        assert run_learner(job, world, prompts=toy_prompts(50), weight_sink=generator.load_weights) == 2
    finally:
        generator.stop()
        shutdown_distributed()
        torch.set_num_threads(threads)
    assert len(seen) == 2
    for step, (during, _) in enumerate(seen, start=1):
        assert during is not None and during.startswith(f"checkpoint step_{step} (pid ")
    assert busy_with(marker) is None and not marker.exists()  # cleared once each was written and acked
