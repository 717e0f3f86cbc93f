"""scripts/bench/learner_workloads.py: the benchmark's Search-R1 batches are laid out as the generators write trajectories
(turn, observation, turn, ...; observations out of the loss), drawn by the planner's sampler, cut into mini-batches of
whole trajectories."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import scripts.bench.learner_workloads as workloads
from config.loader import load_config  # noqa: E402


@pytest.fixture(scope="module")
def spec():
    return workloads.SearchR1Spec.of(load_config("qwen2.5-3b-8xh100"))


def test_a_trajectory_interleaves_turns_and_masked_observations(spec):
    rng = np.random.default_rng(0)
    shape = next(s for s in (spec.draw(rng) for _ in range(100)) if s.searches == 2)
    trajectory = workloads.search_trajectory(rng, shape, vocab=151_936, reward=1.0, limits=spec.limits)
    trajectory.validate()  # the record's own invariants: versions -1 and log-prob 0 exactly where the mask is 0
    t0, t1, t2 = shape.turns
    obs = shape.obs_tokens
    expected = np.concatenate([np.ones(t0), np.zeros(obs), np.ones(t1), np.zeros(obs), np.ones(t2)])
    np.testing.assert_array_equal(trajectory.loss_mask, expected)
    assert len(trajectory.prompt_ids) == shape.prompt == 200 and trajectory.num_tokens == shape.tokens
    assert trajectory.info == {"tool_calls": 2, "finish_reason": "answer"}
    sampled = trajectory.behavior_logprobs[trajectory.loss_mask == 1]
    assert (
        abs(sampled.mean() + np.log(151_936)) < 0.05
    )  # near a uniform policy's, as a random-init model gives


def test_a_response_at_the_budget_ends_with_the_budget_finish_reason(spec):
    shape = workloads.TrajectoryShape(
        prompt=200, turns=(500, 500, 500, 296), obs_tokens=500
    )  # 1,796 + 3 x 500 = 3,296
    limits = dataclasses.replace(spec.limits, max_response_tokens=3296)
    trajectory = workloads.search_trajectory(np.random.default_rng(0), shape, 1000, 0.0, limits)
    assert trajectory.info["finish_reason"] == "budget"


def test_a_mini_batch_of_256_cuts_groups_of_five_as_search_r1_does(spec):
    groups = workloads.search_r1_groups(np.random.default_rng(0), spec, 256, vocab=1000)
    assert [len(g.trajectories) for g in groups] == [5] * 51 + [1]
    assert len({g.group_id for g in groups}) == 52
    for g in groups[:3]:
        assert g.rewards.tolist() == [0.0, 1.0, 0.0, 1.0, 0.0]  # every group carries a GRPO gradient
    stats = workloads.batch_stats([groups])
    assert stats["trajectories"] == 256
    assert 1100 < stats["mean_seq_len"] < 1650 and stats["max_seq_len"] <= 200 + 4096
    assert 0.15 < stats["loss_token_fraction"] < 0.45  # observations and prompts carry no loss
    assert workloads.batch_tokens(groups) == round(stats["mean_seq_len"] * 256)


def test_length_scale_shrinks_every_length_and_the_budgets(spec):
    small = workloads.SearchR1Spec.of(load_config("qwen2.5-3b-8xh100"), length_scale=0.1)
    assert small.workload.prompt_tokens.value == pytest.approx(20)
    assert small.workload.obs_tokens_per_search.value == pytest.approx(40)
    assert (small.limits.max_tokens_per_turn, small.limits.max_response_tokens) == (50, 410)
    assert "lengths x 0.1" in small.describe()
    with pytest.raises(ValueError, match="--length-scale must be > 0"):
        workloads.SearchR1Spec.of(load_config("qwen2.5-3b-8xh100"), length_scale=0)


def test_the_tiny_mix_is_the_old_toy_workload():
    groups = workloads.tiny_groups(np.random.default_rng(0), n_groups=3, group_size=4, max_len=300, vocab=50)
    assert [len(g.trajectories) for g in groups] == [4, 4, 4]
    for t in (t for g in groups for t in g.trajectories):
        assert 32 <= len(t.prompt_ids) < 128 and t.num_tokens <= 300
