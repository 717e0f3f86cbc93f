"""REINFORCE++ and REINFORCE with a group baseline (REINFORCE++-baseline): critic-free, normalised over the batch.

REINFORCE++ (Hu 2025, "REINFORCE++", section 3): the reward of a trajectory is its outcome reward on its last sampled
token plus a per-token KL penalty -beta * KL_t on every sampled token (`kl_placement: reward`, estimator `k1` by
default); each sampled token's return is the (discounted, `gamma`) sum of the rewards from it to the end, and the
returns are normalised over all sampled tokens of the batch (global advantage normalisation: mean 0, std 1, across
the learner ranks), with no per-prompt baseline. Observation tokens are not time steps: the return of a token before
a search includes the rewards after the search's results, which get no reward of their own.

REINFORCE++-baseline (the same paper's group variant, verl's `reinforce_plus_plus_baseline`; "REINFORCE with a group
baseline"): A = score - mean of the group's scores, then normalised over the batch's sampled tokens (each trajectory
weighted by its number of sampled tokens). Unlike Dr. GRPO it is rescaled by the batch's std; unlike GRPO, not by
each group's. With the KL in the reward (not the default here) the score is the reward minus kl_coef times the
trajectory's summed KL.

How both differ from the paper: the update is the same PPO-clip loss as every algorithm here with the chosen
off-policy correction, and the loss is the batch's global token mean.
"""

from __future__ import annotations

import numpy as np

from buffer.records import Group
from learner.algorithms.base import (
    AdvantageBatch,
    Algorithm,
    BatchAdvantages,
    SequenceAlgorithm,
    TokenAdvantages,
    identical_score_groups,
    sampled_only,
    spread_over_response,
    whiten,
)


def returns_to_go(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """G_k = r_k + gamma * G_{k+1} over the time steps (sampled tokens) of one trajectory, G after the last = 0."""
    out = np.zeros(len(rewards), dtype=np.float64)
    running = 0.0
    for k in range(len(rewards) - 1, -1, -1):
        running = rewards[k] + gamma * running
        out[k] = running
    return out


def step_rewards(reward: float, steps: int, kl: np.ndarray | None, kl_coef: float) -> np.ndarray:
    """Per time step: -kl_coef * KL_k on every sampled token, plus the outcome reward on the last one."""
    rewards = np.zeros(steps, dtype=np.float64)
    if kl is not None and kl_coef:
        rewards -= kl_coef * kl
    if steps:
        rewards[-1] += reward
    return rewards


class ReinforcePP(Algorithm):
    def token_advantages(self, batch: AdvantageBatch) -> TokenAdvantages:
        returns = []
        for t in batch.trajectories:
            kl = sampled_only(t.kl, t.loss_mask) if t.kl is not None else None
            steps = int((np.asarray(t.loss_mask) > 0).sum())
            reward = float(batch.rewards[t.group][t.sample])
            returns.append(returns_to_go(step_rewards(reward, steps, kl, batch.kl_coef), self.cfg.gamma))
        advantages = whiten(returns, batch.all_reduce)
        return TokenAdvantages(
            [
                spread_over_response(a, t.loss_mask)
                for a, t in zip(advantages, batch.trajectories, strict=True)
            ],
            zero_adv_groups=0,  # no group baseline: a group of equal rewards still has a gradient
        )


def batch_normalised(
    centred: list[np.ndarray], tokens: list[np.ndarray], eps: float = 1e-8
) -> list[np.ndarray]:
    """Centred scores divided by their std over the batch's sampled tokens (each trajectory weighted by its tokens),
    after removing the token-weighted mean."""
    values = np.concatenate(centred) if centred else np.zeros(0)
    weights = np.concatenate(tokens).astype(np.float64) if tokens else np.zeros(0)
    count = weights.sum()
    if count < 2:
        return [np.zeros_like(c) for c in centred]
    mean = float((values * weights).sum() / count)
    var = float((weights * np.square(values - mean)).sum() / (count - 1))
    return [(c - mean) / np.sqrt(var + eps) for c in centred]


class ReinforceBaseline(SequenceAlgorithm):
    def advantages(self, groups: list[Group], scores: list[np.ndarray] | None = None) -> BatchAdvantages:
        scores = [g.rewards for g in groups] if scores is None else scores
        centred = [np.asarray(s, dtype=np.float64) - np.mean(s) for s in scores]
        tokens = [np.array([t.num_loss_tokens for t in g.trajectories]) for g in groups]
        return BatchAdvantages(batch_normalised(centred, tokens), identical_score_groups(scores))
