"""Advantage estimators, KL estimators and controller, DAPO's shaping, against values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fakes.groups import groups_with_rewards
from learner.algorithms import AdvantageBatch, TrajectoryTokens, build_algorithm, kl_estimate, policy_loss
from learner.algorithms.kl import KLController
from learner.algorithms.ppo import gae
from learner.algorithms.reinforce import returns_to_go
from learner.algorithms.rloo import leave_one_out_advantages
from learner.algorithms.settings import (
    GRPOConfig,
    KLControlConfig,
    NoCorrection,
    OverlongConfig,
    PPOConfig,
    ReinforceBaselineConfig,
    ReinforcePPConfig,
    RLOOConfig,
    TISCorrection,
)
from learner.algorithms.shaping import informative, overlong_penalty, shaped_rewards, truncated

# -- a multi-turn trajectory with two searches -------------------------------------------------------------------
# response: 2 sampled tokens, a 2-token search result, 1 sampled token, a 2-token search result, 2 sampled tokens
TWO_SEARCHES = np.array([1, 1, 0, 0, 1, 0, 0, 1, 1], dtype=np.uint8)
# the critic's values before each response token; the ones at observation tokens must never be read
VALUES = np.array([0.5, 0.4, 100.0, -100.0, 0.6, 100.0, -100.0, 0.2, 0.8])


def test_gae_skips_observation_tokens_by_hand():
    # time steps are the 5 sampled tokens with V = [0.5, 0.4, 0.6, 0.2, 0.8]; reward 1 on the last; gamma 0.9, lam 0.8
    # delta_4 = 1 - 0.8 = 0.2                        A_4 = 0.2
    # delta_3 = 0.9 * 0.8 - 0.2 = 0.52               A_3 = 0.52 + 0.72 * 0.2 = 0.664
    # delta_2 = 0.9 * 0.2 - 0.6 = -0.42              A_2 = -0.42 + 0.72 * 0.664 = 0.05808
    # delta_1 = 0.9 * 0.6 - 0.4 = 0.14               A_1 = 0.14 + 0.72 * 0.05808 = 0.1818176
    # delta_0 = 0.9 * 0.4 - 0.5 = -0.14              A_0 = -0.14 + 0.72 * 0.1818176 = -0.009091328
    expected_adv = [-0.009091328, 0.1818176, 0, 0, 0.05808, 0, 0, 0.664, 0.2]
    expected_ret = [0.490908672, 0.5818176, 0, 0, 0.65808, 0, 0, 0.864, 1.0]
    algorithm = build_algorithm(PPOConfig(gamma=0.9, lam=0.8, whiten_advantages=False), NoCorrection())
    groups = groups_with_rewards([[1.0]])
    batch = AdvantageBatch(
        groups, [np.array([1.0])], [np.array([1.0])], [TrajectoryTokens(0, 0, TWO_SEARCHES, values=VALUES)]
    )
    result = algorithm.token_advantages(batch)
    np.testing.assert_allclose(result.advantages[0], expected_adv, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(result.returns[0], expected_ret, rtol=1e-6, atol=1e-7)
    # Search-R1's way (every response token a time step) reads the values inside the search results: different
    leaky, _ = gae(np.eye(9)[-1], VALUES, 0.9, 0.8)
    assert abs(leaky[0] - expected_adv[0]) > 1.0


def test_gae_with_kl_in_the_reward_and_gamma_lam_one_telescopes():
    # gamma = lam = 1: A_k = sum of the rewards from k on - V_k; the KL penalty falls on sampled tokens only
    kl = np.array([0.1, 0.2, 9.0, 9.0, 0.3, 9.0, 9.0, 0.4, 0.5])  # 9.0 at observations: never used
    algorithm = build_algorithm(PPOConfig(whiten_advantages=False), NoCorrection())
    batch = AdvantageBatch(
        groups_with_rewards([[1.0]]),
        [np.array([1.0])],
        [np.array([1.0])],
        [TrajectoryTokens(0, 0, TWO_SEARCHES, kl=kl, values=VALUES)],
        kl_coef=0.5,
    )
    adv = algorithm.token_advantages(batch).advantages[0]
    # rewards per step: -0.05, -0.1, -0.15, -0.2, 1 - 0.25 = 0.75; sums from k: 0.25, 0.3, 0.4, 0.55, 0.75
    np.testing.assert_allclose(
        adv[TWO_SEARCHES == 1], [0.25 - 0.5, 0.3 - 0.4, 0.4 - 0.6, 0.55 - 0.2, 0.75 - 0.8]
    )
    assert np.all(adv[TWO_SEARCHES == 0] == 0)


def test_ppo_whitens_over_the_sampled_tokens_of_every_rank():
    algorithm = build_algorithm(PPOConfig(gamma=0.9, lam=0.8), NoCorrection())
    raw = np.array([-0.009091328, 0.1818176, 0.05808, 0.664, 0.2])
    other_rank = np.array([1.0, 2.0, 3.0])  # what a second rank contributes to the sums
    reduce = lambda x: x + np.array([3, other_rank.sum(), np.square(other_rank).sum()])  # noqa: E731
    batch = AdvantageBatch(
        groups_with_rewards([[1.0]]),
        [np.array([1.0])],
        [np.array([1.0])],
        [TrajectoryTokens(0, 0, TWO_SEARCHES, values=VALUES)],
        all_reduce=reduce,
    )
    adv = algorithm.token_advantages(batch).advantages[0]
    everything = np.concatenate([raw, other_rank])
    whitened = (raw - everything.mean()) / np.sqrt(everything.var(ddof=1) + 1e-8)
    np.testing.assert_allclose(adv[TWO_SEARCHES == 1], whitened, rtol=1e-6)


def test_rloo_leave_one_out_by_hand():
    # r = [1, 0, 0, 1]: for a 1 the others' mean is 1/3 -> 2/3; for a 0 it is 2/3 -> -2/3
    np.testing.assert_allclose(
        leave_one_out_advantages(np.array([1.0, 0.0, 0.0, 1.0])), [2 / 3, -2 / 3, -2 / 3, 2 / 3]
    )
    np.testing.assert_array_equal(leave_one_out_advantages(np.array([0.7])), [0.0])
    result = build_algorithm(RLOOConfig(), TISCorrection()).advantages(
        groups_with_rewards([[1.0, 1.0], [1.0, 0.0]])
    )
    assert result.zero_adv_groups == 1
    np.testing.assert_allclose(result.advantages[1], [1.0, -1.0])


def test_reinforce_baseline_normalises_over_the_batch_tokens():
    groups = groups_with_rewards([[1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    tokens = [t.num_loss_tokens for g in groups for t in g.trajectories]
    result = build_algorithm(ReinforceBaselineConfig(), TISCorrection()).advantages(groups)
    centred = np.array([0.5, -0.5, 0.5, 0.5, -0.5, -0.5])  # reward - group mean
    mean = (centred * tokens).sum() / sum(tokens)
    std = math.sqrt((np.array(tokens) * (centred - mean) ** 2).sum() / (sum(tokens) - 1) + 1e-8)
    np.testing.assert_allclose(np.concatenate(result.advantages), (centred - mean) / std, rtol=1e-6)


def test_reinforce_pp_returns_to_go_with_token_kl_by_hand():
    # sampled steps: KL [0.1, 0.2, 0.3, 0.4, 0.5], beta 0.5, reward 1, gamma 0.5
    # rewards: [-0.05, -0.1, -0.15, -0.2, 0.75]; G_4 = 0.75, G_3 = -0.2 + 0.375 = 0.175, G_2 = -0.15 + 0.0875
    # = -0.0625, G_1 = -0.1 - 0.03125 = -0.13125, G_0 = -0.05 - 0.065625 = -0.115625
    expected = np.array([-0.115625, -0.13125, -0.0625, 0.175, 0.75])
    np.testing.assert_allclose(returns_to_go(np.array([-0.05, -0.1, -0.15, -0.2, 0.75]), 0.5), expected)
    kl = np.where(TWO_SEARCHES == 1, 0.0, 7.0)
    kl[TWO_SEARCHES == 1] = [0.1, 0.2, 0.3, 0.4, 0.5]
    algorithm = build_algorithm(ReinforcePPConfig(gamma=0.5), NoCorrection())
    batch = AdvantageBatch(
        groups_with_rewards([[1.0]]),
        [np.array([1.0])],
        [np.array([1.0])],
        [TrajectoryTokens(0, 0, TWO_SEARCHES, kl=kl)],
        kl_coef=0.5,
    )
    adv = algorithm.token_advantages(batch).advantages[0]
    whitened = (expected - expected.mean()) / np.sqrt(expected.var(ddof=1) + 1e-8)
    np.testing.assert_allclose(adv[TWO_SEARCHES == 1], whitened, rtol=1e-6)
    assert np.all(adv[TWO_SEARCHES == 0] == 0)


def test_kl_in_the_reward_enters_group_scores():
    groups = groups_with_rewards([[1.0, 1.0]])
    algorithm = build_algorithm(GRPOConfig(kl_coef=0.5, kl_placement="reward"), NoCorrection())
    mask = np.ones(3, dtype=np.uint8)
    batch = AdvantageBatch(
        groups,
        [np.array([1.0, 1.0])],
        [np.array([1.0 - 0.5 * 0.6, 1.0 - 0.5 * 0.2])],  # the trainer's scores: reward - beta * summed KL
        [TrajectoryTokens(0, 0, mask), TrajectoryTokens(0, 1, mask)],
        kl_coef=0.5,
    )
    result = algorithm.token_advantages(batch)
    assert result.zero_adv_groups == 0  # equal rewards, different KL: the less-drifted sample is preferred
    assert result.advantages[1][0] > 0 > result.advantages[0][0]


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])  # log ratio k = log 2
    k = math.log(2.0)
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(k)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * k * k)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.5 + k - 1.0)
    far = kl_estimate(torch.tensor([-20.0]), torch.tensor([0.0]), "low_var_kl")
    assert far.item() == 10.0 and kl_estimate(torch.tensor([-20.0]), torch.tensor([0.0]), "k3").item() > 10


def test_kl_in_the_reward_is_not_a_loss_term():
    args = (
        torch.tensor([0.0]),
        torch.tensor([0.0]),
        torch.tensor([0.0]),
        torch.tensor([1]),
        torch.tensor([0]),
    )
    ref = torch.tensor([math.log(2.0)])
    in_loss, _ = policy_loss(*args, GRPOConfig(kl_coef=0.5), NoCorrection(), ref_logprobs=ref)
    in_reward, stats = policy_loss(
        *args, GRPOConfig(kl_coef=0.5, kl_placement="reward"), NoCorrection(), ref_logprobs=ref
    )
    assert in_loss.item() == pytest.approx(0.5 * (2.0 - math.log(2.0) - 1.0))
    assert in_reward.item() == 0.0 and stats["kl"].item() == pytest.approx(2.0 - math.log(2.0) - 1.0)


def test_proximal_log_probs_of_the_step_start_set_the_ratio():
    logprobs = torch.tensor([math.log(1.5)])
    loss, stats = policy_loss(
        logprobs,
        torch.tensor([0.0]),
        torch.tensor([1.0]),
        torch.tensor([1]),
        torch.tensor([0]),
        GRPOConfig(clip_high=0.28),
        TISCorrection(cap=2.0),
        proximal_logprobs=torch.tensor([0.0]),
    )
    # w = exp(0 - 0) = 1, r = exp(log 1.5 - 0) = 1.5 clipped to 1.28
    assert stats["ratio"].item() == pytest.approx(1.5) and loss.item() == pytest.approx(-1.28)


def test_adaptive_kl_controller_by_hand():
    controller = KLController(0.1, KLControlConfig(type="adaptive", target_kl=0.1, horizon=100))
    controller.update(kl=0.2, trajectories=10)  # error clipped to 0.2: x (1 + 0.2 * 10 / 100)
    assert controller.value == pytest.approx(0.102)
    controller.update(kl=0.05, trajectories=10)  # error -0.5 clipped to -0.2
    assert controller.value == pytest.approx(0.102 * 0.98)
    fixed = KLController(0.1, KLControlConfig())
    fixed.update(kl=5.0, trajectories=10)
    assert fixed.value == 0.1


def test_overlong_penalty_by_hand_and_truncation():
    assert [overlong_penalty(n, 100, 20, 1.0) for n in (80, 90, 100, 120)] == [0.0, -0.5, -1.0, -1.0]
    assert overlong_penalty(99, 100, 0, 1.0) == 0.0
    groups = groups_with_rewards([[1.0, 0.0]])
    lengths = [len(t.response_ids) for t in groups[0].trajectories]
    budget = max(lengths) + 5
    shaped = shaped_rewards(groups, OverlongConfig(buffer_tokens=10, penalty=0.5), budget)[0]
    expected = [r + overlong_penalty(n, budget, 10, 0.5) for r, n in zip([1.0, 0.0], lengths, strict=True)]
    np.testing.assert_allclose(shaped, expected)
    groups[0].trajectories[0].info["finish_reason"] = "budget"
    assert truncated(groups[0].trajectories[0]) and not truncated(groups[0].trajectories[1])
    assert informative(groups[0]) and not informative(groups_with_rewards([[0.5, 0.5]])[0])


def test_clipped_value_loss_by_hand():
    from learner.critic import clipped_value_loss

    # old V = 0 on every token, value_clip 0.5, return 1:
    # V = 0.2: inside the clip, 0.5 * (0.2 - 1)^2 = 0.32
    # V = 0.9: clipped to 0.5, max((0.9 - 1)^2, (0.5 - 1)^2) = 0.25 -> 0.125 (the clip holds the step back)
    # V = 1.8: clipped to 0.5, max(0.64, 0.25) -> 0.32 (a move away from the return is never rewarded by the clip)
    # the fourth token is an observation: no loss
    values = torch.tensor([0.2, 0.9, 1.8, 5.0], requires_grad=True)
    loss, stats = clipped_value_loss(
        values, torch.zeros(4), torch.ones(4), torch.tensor([1, 1, 1, 0]), value_clip=0.5
    )
    torch.testing.assert_close(loss, torch.tensor([0.32, 0.125, 0.32, 0.0]))
    torch.testing.assert_close(stats["value_clipped"], torch.tensor([0.0, 1.0, 0.0, 0.0]))
    loss.sum().backward()
    # d/dV: (V - R) where the unclipped error counts, 0 where the clipped one does (the clipped value is constant)
    torch.testing.assert_close(values.grad, torch.tensor([-0.8, 0.0, 0.8, 0.0]))
