"""The step's updates on one gloo rank: PPO mini-batches and epochs, the critic (PPO), the KL in the reward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fakes.groups import random_groups
from learner.settings import LearnerConfig
from learner.trainer import Learner


def _cfg(**overrides) -> LearnerConfig:
    base = dict(groups_per_step=4, lr=1e-3, micro_batch_tokens=128, max_staleness=1, total_steps=10)
    return LearnerConfig(**(base | overrides))


def _weights(learner: Learner) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor().clone() for k, v in learner.model.state_dict().items()}


def test_two_mini_batches_are_two_updates_in_one_version(world, tiny_model_dir):
    # with the plain PPO ratio (no proximal policy) and mini-batches that hold whole groups, one step on two
    # mini-batches is exactly two steps on the halves, except that it publishes one version
    groups = random_groups(np.random.default_rng(0), n_groups=4, group_size=2, version=0)
    split = Learner(_cfg(ppo_mini_batch_size=4, correction="none"), tiny_model_dir, world)
    metrics = split.train_step(groups)
    halves = Learner(_cfg(groups_per_step=2, correction="none"), tiny_model_dir, world)
    halves.train_step(groups[:2])
    halves.train_step(groups[2:])
    assert metrics["perf/updates"] == 2 and split.version == 1 and halves.version == 2
    for name, tensor in _weights(split).items():
        torch.testing.assert_close(tensor, _weights(halves)[name], atol=1e-6, rtol=1e-5)


def test_later_updates_use_the_step_start_policy_as_proximal(world, tiny_model_dir):
    groups = random_groups(np.random.default_rng(1), n_groups=4, group_size=2, version=0)
    one = Learner(_cfg(), tiny_model_dir, world).train_step(groups)
    # the proximal policy is the step's start: the ratio is exactly 1 in the one update of a plain step ...
    assert one["loss/ratio_max"] == pytest.approx(1.0) and one["perf/updates"] == 1
    # ... and moves away from 1 once earlier updates of the same step changed the weights
    several = Learner(_cfg(ppo_mini_batch_size=4, ppo_epochs=2), tiny_model_dir, world).train_step(groups)
    assert several["perf/updates"] == 4 and several["loss/ratio_max"] > 1.001


def test_ppo_critic_fits_the_returns(world, tiny_model_dir):
    learner = Learner(
        _cfg(groups_per_step=2, algorithm={"type": "ppo", "critic": {"lr": 1e-3}}), tiny_model_dir, world
    )
    groups = random_groups(np.random.default_rng(2), n_groups=2, group_size=2, version=0)
    losses = []
    for step in range(4):
        for g in groups:  # the same batch, made fresh for each version
            for t in g.trajectories:
                t.versions[t.loss_mask == 1] = step
        metrics = learner.train_step(groups)
        losses.append(metrics["critic/value_loss"])
    assert metrics["critic/lr"] == pytest.approx(1e-3)
    assert losses[-1] < 0.5 * losses[0], losses  # the values move towards the returns
    assert metrics["critic/explained_var"] > 0.0


def test_critic_warmup_leaves_the_policy_alone(world, tiny_model_dir):
    cfg = _cfg(groups_per_step=2, algorithm={"type": "ppo", "critic_warmup": 1})
    learner = Learner(cfg, tiny_model_dir, world)
    before = _weights(learner)
    groups = random_groups(np.random.default_rng(3), n_groups=2, group_size=2, version=0)
    metrics = learner.train_step(groups)
    assert metrics["critic/grad_norm"] > 0 and metrics["loss/grad_norm"] == 0.0 and learner.version == 1
    for name, tensor in _weights(learner).items():
        torch.testing.assert_close(tensor, before[name], rtol=0, atol=0)
    learner.train_step(random_groups(np.random.default_rng(4), n_groups=2, group_size=2, version=1))
    assert any(
        not torch.equal(t, before[n]) for n, t in _weights(learner).items()
    )  # after the warmup it learns


def test_critic_is_checkpointed_and_resumed_with_the_policy(world, tiny_model_dir, tmp_path):
    from learner.checkpoints.checkpointer import Checkpointer, ResumeState

    cfg = _cfg(
        groups_per_step=2,
        algorithm={"type": "ppo", "kl_coef": 0.05, "kl_placement": "reward", "kl_ctrl": {"type": "adaptive"}},
    )
    learner = Learner(cfg, tiny_model_dir, world)
    learner.train_step(random_groups(np.random.default_rng(5), n_groups=2, group_size=2, version=0))
    assert learner.algorithm.kl_controller.value != 0.05  # the adaptive coefficient moved
    ckpt = Checkpointer(tmp_path / "checkpoints", world, tiny_model_dir, keep=1)
    path = ckpt.save(
        learner.model,
        learner.optimizer,
        learner.scheduler,
        ResumeState(version=1, extra=learner.resume_extra()),
        critic=learner.critic,
    )
    resumed = Learner(cfg, tiny_model_dir, world)
    state = ckpt.load(path, resumed.model, resumed.optimizer, resumed.scheduler, critic=resumed.critic)
    resumed.restore_extra(state.extra)
    resumed.version = state.version
    assert resumed.algorithm.kl_controller.value == learner.algorithm.kl_controller.value
    next_groups = random_groups(np.random.default_rng(6), n_groups=2, group_size=2, version=1)
    a, b = learner.train_step(next_groups), resumed.train_step(next_groups)
    for key in ("critic/value_loss", "critic/value_mean", "loss/pg", "kl/coef"):
        assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), key
    # a checkpoint without a critic cannot resume PPO
    grpo = Learner(_cfg(groups_per_step=2), tiny_model_dir, world)
    grpo.train_step(random_groups(np.random.default_rng(7), n_groups=2, group_size=2, version=0))
    other = Checkpointer(tmp_path / "grpo", world, tiny_model_dir, keep=1)
    grpo_path = other.save(grpo.model, grpo.optimizer, grpo.scheduler, ResumeState(version=1))
    with pytest.raises(ValueError, match="holds no critic"):
        other.load(grpo_path, resumed.model, resumed.optimizer, resumed.scheduler, critic=resumed.critic)


def test_kl_in_the_reward_uses_a_reference_and_overlong_filtering_masks(world, tiny_model_dir):
    learner = Learner(_cfg(algorithm={"type": "reinforce_pp", "kl_coef": 0.1}), tiny_model_dir, world)
    assert learner.reference is not None
    groups = random_groups(np.random.default_rng(8), n_groups=4, group_size=2, version=0)
    learner.train_step(groups)
    later = random_groups(np.random.default_rng(9), n_groups=4, group_size=2, version=1)
    metrics = learner.train_step(later)
    assert metrics["loss/kl_ref"] != 0.0 and metrics["kl/coef"] == pytest.approx(0.1)
    # overlong filtering: the truncated trajectory's tokens leave the loss
    masked = Learner(
        _cfg(algorithm={"type": "grpo", "overlong": {"mask_truncated": True}}), tiny_model_dir, world
    )
    groups = random_groups(np.random.default_rng(10), n_groups=4, group_size=2, version=0)
    cut = groups[0].trajectories[0]
    cut.info["finish_reason"] = "budget"
    metrics = masked.train_step(groups)
    total = sum(t.num_loss_tokens for g in groups for t in g.trajectories)
    assert metrics["batch/loss_tokens"] == total - cut.num_loss_tokens
    assert metrics["batch/truncated_frac"] == pytest.approx(1 / 8)


def test_kl_in_the_reward_breaks_ties_in_sequence_scores(world, tiny_model_dir):
    # GRPO with the KL in the reward: a trajectory's score is its reward minus kl_coef times its summed KL, so
    # once the policy has moved from the reference a group of equal rewards still has an advantage; with the KL
    # in the loss (or off) it has none and is counted
    equal = random_groups(np.random.default_rng(12), n_groups=4, group_size=2, version=1)
    for g in equal:
        for t in g.trajectories:
            t.reward = 1.0
    counts = {}
    for placement in ("reward", "loss"):
        learner = Learner(
            _cfg(algorithm={"type": "grpo", "kl_coef": 0.1, "kl_placement": placement}), tiny_model_dir, world
        )
        learner.train_step(random_groups(np.random.default_rng(11), n_groups=4, group_size=2, version=0))
        metrics = learner.train_step(equal)
        assert metrics["loss/kl_ref"] > 0  # the first step moved the policy away from the reference
        counts[placement] = metrics["batch/zero_adv_groups"]
    assert counts == {"reward": 0, "loss": 4}
