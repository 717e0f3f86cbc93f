"""PPO with a critic (Schulman et al. 2017) and GAE (Schulman et al. 2016) over the tokens the model sampled.

The value model (`learner/critic.py`) gives V(s) for the state before each response token. A trajectory's time steps
are its sampled tokens only: an observation block (the search results) is part of the environment's transition from
one sampled token to the next, not a step of its own. With k indexing sampled tokens,

    r_k     = -beta * KL_k (when the KL is in the reward) + the outcome reward on the last sampled token
    delta_k = r_k + gamma * V_{k+1} - V_k                 (V after the last sampled token = 0: the episode ended)
    A_k     = delta_k + gamma * lam * A_{k+1},   returns_k = A_k + V_k

so V_{k+1} of the token after a search is read at that token, with the results in its context. Search-R1 runs GAE
over the attention mask, so retrieved tokens count as time steps: with gamma = lam = 1 the policy's advantages come out
the same (the sum telescopes), but the whitening statistics and the value loss include retrieved tokens, and with
lam < 1 or gamma < 1 the retrieved tokens add discounting and bootstrap from values inside the retrieved text.
Advantages are then whitened over the batch's sampled tokens across ranks (`whiten_advantages`), as Search-R1/verl do.

Staleness (the learner trains on trajectories up to `max_staleness` versions old):
- sampled by the behaviour policy mu (the engine's weights, per token): the tokens and the outcome rewards;
- the current learner at the start of the step: the critic's values V (and old values for value clipping), the
  proximal policy of the correction and the KL-in-reward's log-probs; so GAE's advantages and returns combine mu's
  trajectory with the current critic (no per-token importance weights inside the recursion);
- the policy term is PPO-clip with the chosen correction (`learner.correction`): ratio to the proximal policy and an
  importance weight proximal/behaviour (tis, icepop, decoupled), or the plain ratio to mu (none);
- the value loss is not importance-weighted: the critic regresses on returns of mu's trajectories (it learns V of a
  mixture of recent policies, as in asynchronous actor-critic without V-trace).

`critic_warmup` steps at the start train only the critic (the policy's weights, and its learning-rate schedule, wait).
"""

from __future__ import annotations

import numpy as np

from learner.algorithms.base import (
    AdvantageBatch,
    Algorithm,
    TokenAdvantages,
    sampled_only,
    spread_over_response,
    whiten,
)
from learner.algorithms.reinforce import step_rewards


def gae(rewards: np.ndarray, values: np.ndarray, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """(advantages, returns) over one trajectory's time steps; the value after the last step is 0 (terminal)."""
    steps = len(rewards)
    advantages = np.zeros(steps, dtype=np.float64)
    running = 0.0
    for k in range(steps - 1, -1, -1):
        next_value = values[k + 1] if k + 1 < steps else 0.0
        delta = rewards[k] + gamma * next_value - values[k]
        running = delta + gamma * lam * running
        advantages[k] = running
    return advantages, advantages + np.asarray(values, dtype=np.float64)


class PPO(Algorithm):
    """PPO's advantages and returns from the critic's values (`PPOConfig.needs_critic`: the learner trains one)."""

    def token_advantages(self, batch: AdvantageBatch) -> TokenAdvantages:
        advantages, returns = [], []
        for t in batch.trajectories:
            if t.values is None:
                raise ValueError("PPO needs the critic's values of every trajectory")
            values = sampled_only(t.values, t.loss_mask)
            kl = sampled_only(t.kl, t.loss_mask) if t.kl is not None else None
            reward = float(batch.rewards[t.group][t.sample])
            adv, ret = gae(
                step_rewards(reward, len(values), kl, batch.kl_coef), values, self.cfg.gamma, self.cfg.lam
            )
            advantages.append(adv)
            returns.append(ret)
        if self.cfg.whiten_advantages:
            advantages = whiten(advantages, batch.all_reduce)
        spread = [
            spread_over_response(a, t.loss_mask) for a, t in zip(advantages, batch.trajectories, strict=True)
        ]
        targets = [
            spread_over_response(r, t.loss_mask) for r, t in zip(returns, batch.trajectories, strict=True)
        ]
        return TokenAdvantages(spread, zero_adv_groups=0, returns=targets)
