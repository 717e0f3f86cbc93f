"""The algorithms' advantages and per-token losses against values computed by hand, for every correction."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fakes.groups import groups_with_rewards
from learner.algorithms import build_algorithm, low_var_kl, policy_loss
from learner.algorithms.corrections import loglinear_proximal
from learner.algorithms.grpo import group_advantages
from learner.algorithms.settings import (
    DecoupledCorrection,
    DrGRPOConfig,
    GRPOConfig,
    IcePopCorrection,
    NoCorrection,
    TISCorrection,
)


def test_grpo_advantages_by_hand():
    # mean 0.5, unbiased std sqrt((4 * 0.25) / 3) = 0.57735
    adv = group_advantages(np.array([1.0, 0.0, 0.0, 1.0]), std_normalize=True, eps=0.0)
    np.testing.assert_allclose(adv, [0.8660254, -0.8660254, -0.8660254, 0.8660254], rtol=1e-6)


def test_drgrpo_advantages_are_centred_only():
    adv = group_advantages(np.array([1.0, 0.0, 0.0, 0.0]), std_normalize=False)
    np.testing.assert_allclose(adv, [0.75, -0.25, -0.25, -0.25])


def test_identical_rewards_give_zero_advantage_and_are_counted():
    groups = groups_with_rewards([[1.0, 1.0], [0.0, 1.0], [0.3]])
    for cfg in (GRPOConfig(), DrGRPOConfig()):
        result = build_algorithm(cfg, TISCorrection()).advantages(groups)
        assert result.zero_adv_groups == 2
        np.testing.assert_array_equal(result.advantages[0], [0.0, 0.0])
        assert result.advantages[1][1] > 0 > result.advantages[1][0]
        np.testing.assert_array_equal(result.advantages[2], [0.0])


def test_the_two_algorithms_differ_only_in_the_std():
    groups = groups_with_rewards([[1.0, 0.0, 0.0, 0.0]])
    grpo = build_algorithm(GRPOConfig(), TISCorrection()).advantages(groups).advantages[0]
    dr = build_algorithm(DrGRPOConfig(), TISCorrection()).advantages(groups).advantages[0]
    np.testing.assert_allclose(dr, [0.75, -0.25, -0.25, -0.25])
    np.testing.assert_allclose(grpo, dr / (np.std([1.0, 0.0, 0.0, 0.0], ddof=1) + 1e-6))


def _t(values):
    return torch.tensor(values, dtype=torch.float64)


def test_none_is_ppo_clip_against_behaviour():
    logprobs = _t([math.log(1.5), math.log(0.5), math.log(1.1), 3.0]).requires_grad_()
    loss, stats = policy_loss(
        logprobs,
        _t([0.0] * 4),
        _t([1.0, -1.0, 2.0, 5.0]),
        _t([1, 1, 1, 0]),
        _t([0] * 4),
        GRPOConfig(clip_low=0.2, clip_high=0.28),
        NoCorrection(),
    )
    # 1.5 clipped to 1.28; 0.5 clipped to 0.8 with A<0 -> -(-0.8); 1.1 inside; masked token contributes 0
    torch.testing.assert_close(loss.detach(), _t([-1.28, 0.8, -2.2, 0.0]))
    torch.testing.assert_close(stats["clipped"][:3], _t([1.0, 1.0, 0.0]))
    loss.sum().backward()
    # clipped tokens have no gradient; d(-r*A)/d logprob = -r*A = -2.2 for the third
    torch.testing.assert_close(logprobs.grad, _t([0.0, 0.0, -2.2, 0.0]))


def test_tis_truncates_the_weight_and_uses_the_proximal_ratio():
    logprobs = _t([math.log(3.0), math.log(0.5)]).requires_grad_()
    loss, stats = policy_loss(
        logprobs,
        _t([0.0, 0.0]),
        _t([0.5, -2.0]),
        _t([1, 1]),
        _t([1, 1]),
        GRPOConfig(),
        TISCorrection(cap=2.0),
    )
    # ratio to the proximal (recomputed = current) policy is 1; w = min(3, 2) = 2 and 0.5
    torch.testing.assert_close(loss.detach(), _t([-1.0, 1.0]))
    torch.testing.assert_close(stats["is_weight"], _t([2.0, 0.5]))
    loss.sum().backward()
    torch.testing.assert_close(logprobs.grad, _t([-1.0, 1.0]))  # -w * A * r


def test_icepop_masks_weights_outside_the_band():
    logprobs = _t([math.log(3.0), math.log(0.5), math.log(0.25), math.log(1.5)])
    loss, stats = policy_loss(
        logprobs,
        _t([0.0] * 4),
        _t([1.0] * 4),
        _t([1] * 4),
        _t([0] * 4),
        GRPOConfig(),
        IcePopCorrection(low=0.5, high=2.0),
    )
    torch.testing.assert_close(loss, _t([0.0, -0.5, 0.0, -1.5]))
    torch.testing.assert_close(stats["masked"], _t([1.0, 0.0, 1.0, 0.0]))


def test_decoupled_masks_weights_above_the_cap():
    logprobs = _t([math.log(3.0), math.log(1.5)])
    loss, stats = policy_loss(
        logprobs, _t([0.0, 0.0]), _t([1.0, 1.0]), _t([1, 1]), _t([2, 2]), GRPOConfig(), DecoupledCorrection()
    )
    torch.testing.assert_close(loss, _t([0.0, -1.5]))
    torch.testing.assert_close(stats["masked"], _t([1.0, 0.0]))


def test_loglinear_proximal_interpolates_by_staleness():
    # s = 1: alpha = 1/2, l_p = 0.5 * log 4 = log 2; s = 0: l_p = l_mu; s = 3: alpha = 3/4
    prox = loglinear_proximal(_t([math.log(4.0), 0.7, 1.0]), _t([0.0, 0.2, 0.0]), _t([1, 0, 3]))
    torch.testing.assert_close(prox, _t([math.log(2.0), 0.2, 0.75]))


def test_decoupled_loglinear_by_hand():
    logprobs = _t([math.log(4.0)]).requires_grad_()
    loss, stats = policy_loss(
        logprobs,
        _t([0.0]),
        _t([1.0]),
        _t([1]),
        _t([1]),
        GRPOConfig(clip_high=0.28),
        TISCorrection(proximal="loglinear", cap=2.0),
    )
    # l_p = log 2 -> w = min(2, 2) = 2; r = exp(log 4 - log 2) = 2 clipped to 1.28 -> -2 * 1.28
    torch.testing.assert_close(loss.detach(), _t([-2.56]))
    torch.testing.assert_close(stats["clipped"], _t([1.0]))


def test_low_var_kl_and_the_penalty_term():
    torch.testing.assert_close(low_var_kl(_t([0.0]), _t([math.log(2.0)])), _t([1.0 - math.log(2.0)]))
    loss, stats = policy_loss(
        _t([0.0]),
        _t([0.0]),
        _t([0.0]),
        _t([1]),
        _t([0]),
        GRPOConfig(kl_coef=0.5, entropy_coef=0.1),
        NoCorrection(),
        ref_logprobs=_t([math.log(2.0)]),
        entropy=_t([2.0]),
    )
    torch.testing.assert_close(loss, _t([0.5 * (1.0 - math.log(2.0)) - 0.2]))
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(
            _t([0.0]), _t([0.0]), _t([0.0]), _t([1]), _t([0]), GRPOConfig(kl_coef=0.1), TISCorrection()
        )


def test_mismatch_kl_is_k3_of_the_behaviour_ratio():
    _, stats = policy_loss(
        _t([math.log(2.0)]), _t([0.0]), _t([1.0]), _t([1]), _t([0]), GRPOConfig(), NoCorrection()
    )
    torch.testing.assert_close(stats["mismatch_kl"], _t([1.0 - math.log(2.0)]))


def test_unknown_correction_is_a_clear_error():
    from config import ConfigError, load_config

    with pytest.raises(ConfigError, match="'ppo'; known types: none, tis, icepop, decoupled"):
        load_config("tiny", ["learner.correction=ppo"])


def test_every_algorithm_of_the_union_builds_its_class():
    from learner.algorithms.grpo import GRPO, DrGRPO
    from learner.algorithms.ppo import PPO
    from learner.algorithms.reinforce import ReinforceBaseline, ReinforcePP
    from learner.algorithms.rloo import RLOO
    from learner.algorithms.settings import ALGORITHMS

    expected = {"grpo": GRPO, "drgrpo": DrGRPO, "rloo": RLOO, "reinforce_pp": ReinforcePP}
    expected |= {"reinforce_baseline": ReinforceBaseline, "ppo": PPO}
    members = list(ALGORITHMS.members.values())
    assert list(ALGORITHMS.members) == ["grpo", "drgrpo", "rloo", "reinforce_pp", "reinforce_baseline", "ppo"]
    for member in members:
        algorithm = build_algorithm(member(), NoCorrection())
        assert type(algorithm) is expected.pop(member().type), member
    assert not expected


def test_an_unknown_algorithm_config_fails_naming_the_known_ones():
    with pytest.raises(TypeError, match="NoCorrection; known algorithms: grpo, drgrpo, rloo, reinforce_pp"):
        build_algorithm(NoCorrection(), NoCorrection())


def test_each_member_owns_the_facts_others_read():
    from learner.algorithms.settings import ALGORITHMS, DecoupledCorrection, IcePopCorrection, TISCorrection

    assert [name for name, member in ALGORITHMS.members.items() if member.needs_critic] == ["ppo"]
    for member in ALGORITHMS.members.values():
        assert build_algorithm(member(), NoCorrection()).needs_values is member.needs_critic
    assert GRPOConfig(kl_coef=0.01).needs_reference and not GRPOConfig().needs_reference
    corrections = [
        NoCorrection(),
        TISCorrection(),
        IcePopCorrection(proximal="loglinear"),
        DecoupledCorrection(),
    ]
    assert [c.recomputes_proximal for c in corrections] == [False, True, False, True]
