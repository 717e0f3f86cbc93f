"""Advantages and per-token losses against values computed by hand, for every correction mode."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from learner.advantages import batch_advantages, group_advantages
from learner.losses import LossSettings, loglinear_proximal, low_var_kl, policy_loss


def test_grpo_advantages_by_hand():
    # mean 0.5, unbiased std sqrt((4 * 0.25) / 3) = 0.57735
    adv = group_advantages(np.array([1.0, 0.0, 0.0, 1.0]), "grpo", eps=0.0)
    np.testing.assert_allclose(adv, [0.8660254, -0.8660254, -0.8660254, 0.8660254], rtol=1e-6)


def test_drgrpo_advantages_are_centred_only():
    adv = group_advantages(np.array([1.0, 0.0, 0.0, 0.0]), "drgrpo")
    np.testing.assert_allclose(adv, [0.75, -0.25, -0.25, -0.25])


def test_identical_rewards_give_zero_advantage_and_are_counted():
    result = batch_advantages([np.array([1.0, 1.0]), np.array([0.0, 1.0]), np.array([0.3])], "grpo")
    assert result.zero_adv_groups == 2
    np.testing.assert_array_equal(result.advantages[0], [0.0, 0.0])
    assert result.advantages[1][1] > 0 > result.advantages[1][0]
    with pytest.raises(ValueError, match="unknown advantage kind"):
        group_advantages(np.array([0.0, 1.0]), "ppo")


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
        LossSettings(correction="none", clip_low=0.2, clip_high=0.28),
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
        LossSettings(correction="tis", tis_cap=2.0),
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
        LossSettings(correction="icepop", icepop_low=0.5, icepop_high=2.0),
    )
    torch.testing.assert_close(loss, _t([0.0, -0.5, 0.0, -1.5]))
    torch.testing.assert_close(stats["masked"], _t([1.0, 0.0, 1.0, 0.0]))


def test_decoupled_masks_weights_above_the_cap():
    logprobs = _t([math.log(3.0), math.log(1.5)])
    loss, stats = policy_loss(
        logprobs, _t([0.0, 0.0]), _t([1.0, 1.0]), _t([1, 1]), _t([2, 2]), LossSettings(correction="decoupled")
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
        LossSettings(correction="tis", proximal="loglinear", tis_cap=2.0, clip_high=0.28),
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
        LossSettings(correction="none", kl_coef=0.5, entropy_coef=0.1),
        ref_logprobs=_t([math.log(2.0)]),
        entropy=_t([2.0]),
    )
    torch.testing.assert_close(loss, _t([0.5 * (1.0 - math.log(2.0)) - 0.2]))
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(_t([0.0]), _t([0.0]), _t([0.0]), _t([1]), _t([0]), LossSettings(kl_coef=0.1))


def test_mismatch_kl_is_k3_of_the_behaviour_ratio():
    _, stats = policy_loss(
        _t([math.log(2.0)]), _t([0.0]), _t([1.0]), _t([1]), _t([0]), LossSettings(correction="none")
    )
    torch.testing.assert_close(stats["mismatch_kl"], _t([1.0 - math.log(2.0)]))


def test_unknown_correction_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown correction 'ppo'"):
        policy_loss(_t([0.0]), _t([0.0]), _t([1.0]), _t([1]), _t([0]), LossSettings(correction="ppo"))
