"""The FSDP2 step on one gloo rank: it learns, it asserts the staleness bound, checkpoints load and resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from buffer.staleness import StalenessError, check_staleness
from fakes.groups import random_groups
from learner.settings import LearnerConfig
from learner.trainer import Learner


def _cfg(**overrides) -> LearnerConfig:
    base = dict(groups_per_step=2, lr=1e-3, micro_batch_tokens=96, max_staleness=1, total_steps=10)
    return LearnerConfig(**(base | overrides))


def test_staleness_bound_is_checked_per_token():
    groups = random_groups(np.random.default_rng(0), n_groups=2, group_size=2, version=3)
    assert check_staleness(groups, 4, max_staleness=1).max() == 1
    with pytest.raises(StalenessError, match="2 versions old"):
        check_staleness(groups, 5, max_staleness=1)
    # no exception for anyone: groups trained in steps a crash lost are generated again, not replayed
    assert check_staleness(groups, 5, max_staleness=2).max() == 2


def test_step_trains_and_reports_metrics(world, tiny_model_dir):
    learner = Learner(_cfg(), tiny_model_dir, world)
    groups = random_groups(np.random.default_rng(1), n_groups=2, group_size=4, version=0)
    before = {k: v.full_tensor().clone() for k, v in learner.model.state_dict().items()}
    metrics = learner.train_step(groups)
    assert learner.version == 1 and metrics["learner/version"] == 1
    assert metrics["perf/micro_batches"] >= 2  # the budget forces several packed micro-batches
    assert metrics["batch/loss_tokens"] == sum(t.num_loss_tokens for g in groups for t in g.trajectories)
    assert np.isfinite(metrics["loss/pg"]) and metrics["loss/grad_norm"] > 0
    changed = [
        k for k, v in learner.model.state_dict().items() if not torch.equal(v.full_tensor(), before[k])
    ]
    assert "model.layers.0.self_attn.q_proj.weight" in changed
    with pytest.raises(StalenessError):
        learner.train_step(random_groups(np.random.default_rng(2), n_groups=2, group_size=2, version=-1))


def test_global_token_mean_does_not_depend_on_micro_batching(world, tiny_model_dir):
    groups = random_groups(np.random.default_rng(3), n_groups=2, group_size=4, version=0)
    metrics, weights = [], []
    for budget in (64, 4096):
        learner = Learner(_cfg(micro_batch_tokens=budget, lr=1e-3), tiny_model_dir, world)
        metrics.append(learner.train_step(groups))
        weights.append(learner.model.state_dict()["model.layers.1.mlp.up_proj.weight"].full_tensor().clone())
    assert metrics[0]["perf/micro_batches"] > 1 == metrics[1]["perf/micro_batches"]
    for key in ("loss/pg", "loss/grad_norm", "loss/entropy", "is/weight_mean"):
        assert metrics[0][key] == pytest.approx(metrics[1][key], rel=1e-5), key
    # Adam normalises each coordinate, so near-zero gradients differ by float noise: bound it by 1% of a step
    torch.testing.assert_close(weights[0], weights[1], atol=1e-5, rtol=0)


def test_checkpoint_loads_in_transformers_and_resumes(world, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from learner.checkpoints.checkpointer import Checkpointer, ResumeState

    learner = Learner(_cfg(), tiny_model_dir, world)
    learner.train_step(random_groups(np.random.default_rng(4), n_groups=2, group_size=2, version=0))
    ckpt = Checkpointer(tmp_path / "checkpoints", world, tiny_model_dir, keep=1)
    path = ckpt.save(
        learner.model,
        learner.optimizer,
        learner.scheduler,
        ResumeState(version=1, cursor=7, used_group_entries=["1-0"]),
    )
    assert ckpt.latest() == path and (path / "tokenizer.json").is_file()
    hf = AutoModelForCausalLM.from_pretrained(path)
    for name, tensor in learner.model.state_dict().items():
        torch.testing.assert_close(hf.state_dict()[name], tensor.full_tensor())

    # a fresh learner restored from the checkpoint takes exactly the same next step
    next_groups = random_groups(np.random.default_rng(5), n_groups=2, group_size=2, version=1)
    resumed = Learner(_cfg(), tiny_model_dir, world)
    state = ckpt.load(path, resumed.model, resumed.optimizer, resumed.scheduler)
    assert (state.version, state.cursor, state.used_group_entries) == (1, 7, ["1-0"])
    resumed.version = state.version
    a, b = learner.train_step(next_groups), resumed.train_step(next_groups)
    assert a["loss/pg"] == pytest.approx(b["loss/pg"], rel=1e-6)
    for name, tensor in learner.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name].full_tensor(), tensor.full_tensor())
    ckpt.save(learner.model, learner.optimizer, learner.scheduler, ResumeState(version=2))
    assert (
        not path.exists()
        and json.loads((ckpt.latest() / "resume" / "state.json").read_text())["version"] == 2
    )


def test_gradient_checkpointing_gives_the_same_step(world, tiny_model_dir):
    groups = random_groups(np.random.default_rng(6), n_groups=2, group_size=2, version=0)
    results = []
    for checkpointing in (False, True):
        learner = Learner(_cfg(gradient_checkpointing=checkpointing), tiny_model_dir, world)
        results.append(learner.train_step(groups))
    for key in ("loss/pg", "loss/grad_norm"):
        assert results[0][key] == pytest.approx(results[1][key], rel=1e-5), key


def test_a_nonfinite_loss_skips_the_update_and_the_next_step_trains(world, tiny_model_dir, monkeypatch):
    learner = Learner(_cfg(), tiny_model_dir, world)
    groups = random_groups(np.random.default_rng(7), n_groups=2, group_size=2, version=0)
    before = {k: v.full_tensor().clone() for k, v in learner.model.state_dict().items()}
    healthy = learner._micro_batch_loss

    def poisoned(*args, **kwargs):
        loss, stats = healthy(*args, **kwargs)
        return loss * float("nan"), stats

    monkeypatch.setattr(learner, "_micro_batch_loss", poisoned)
    metrics = learner.train_step(groups)
    assert metrics["loss/nonfinite_skipped"] == 1.0 and learner.version == 1
    for name, tensor in learner.model.state_dict().items():
        assert torch.equal(tensor.full_tensor(), before[name]), name
    assert not learner.optimizer.state  # AdamW never stepped: no moment holds a NaN
    assert all(p.grad is None for p in learner.model.parameters())

    monkeypatch.setattr(learner, "_micro_batch_loss", healthy)
    groups = random_groups(np.random.default_rng(8), n_groups=2, group_size=2, version=1)
    metrics = learner.train_step(groups)
    assert metrics["loss/nonfinite_skipped"] == 0.0 and np.isfinite(metrics["loss/grad_norm"])
    weight = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(learner.model.state_dict()[weight].full_tensor(), before[weight])
