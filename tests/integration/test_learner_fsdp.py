"""FSDP2 over 2 gloo ranks gives the same loss trajectory as 1 rank with a fixed seed (same batches)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

STEPS = 3

pytestmark = pytest.mark.slow  # several processes, or many steps: `make test-fast` leaves it out


def _rank_main(rank: int, world_size: int, port: int, model_dir: str, out: str) -> None:
    from fakes.groups import random_groups
    from learner.settings import LearnerConfig
    from learner.trainer import Learner
    from tests.fakes.gloo import gloo_rank

    with gloo_rank(rank, world_size, port) as world:
        cfg = LearnerConfig(
            groups_per_step=4, lr=1e-3, micro_batch_tokens=80, max_staleness=1, correction="tis"
        )
        learner = Learner(cfg, model_dir, world, seed=0)
        rng = np.random.default_rng(0)  # the same batches on every rank and in both runs
        history = []
        for step in range(STEPS):
            groups = random_groups(rng, n_groups=4, group_size=3, version=max(0, step - 1))
            metrics = learner.train_step(groups)
            history.append(
                {k: metrics[k] for k in ("loss/pg", "loss/grad_norm", "loss/entropy", "is/weight_mean")}
            )
        weight = learner.model.state_dict()["model.layers.1.self_attn.o_proj.weight"].full_tensor()
        if rank == 0:
            Path(out).write_text(
                json.dumps({"history": history, "weight_sum": float(weight.double().abs().sum())})
            )


def _run(world_size: int, port: int, model_dir: Path, out: Path) -> dict:
    from tests.fakes.gloo import run_ranks

    run_ranks(_rank_main, world_size, port, str(model_dir), str(out))
    return json.loads(out.read_text())


@pytest.mark.timeout(300)
def test_two_gloo_ranks_match_one_rank(tiny_model_dir, tmp_path, free_port):
    one = _run(1, free_port, tiny_model_dir, tmp_path / "one.json")
    two = _run(2, free_port, tiny_model_dir, tmp_path / "two.json")
    for step, (a, b) in enumerate(zip(one["history"], two["history"], strict=True)):
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (
                f"step {step} {key}: {a[key]} vs {b[key]}"
            )
    assert one["history"][0]["loss/pg"] != one["history"][-1]["loss/pg"]  # the trajectory actually moves
    assert one["weight_sum"] == pytest.approx(two["weight_sum"], rel=1e-5)
