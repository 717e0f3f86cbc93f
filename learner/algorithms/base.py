"""What an algorithm supplies to the learner's step: advantages for a batch of groups and a per-token loss.

    algorithm = build_algorithm(cfg.learner.algorithm, cfg.learner.correction)   # learner/algorithms/__init__.py
    result = algorithm.token_advantages(batch)     # AdvantageBatch -> one array per trajectory of this rank's share
    per_token, stats = algorithm.loss(logprobs, behavior, adv, loss_mask, staleness, entropy=..., ref_logprobs=...)

Sequence-level algorithms (GRPO, Dr. GRPO, RLOO, REINFORCE++-baseline) implement `advantages(groups, scores)`: one
value per trajectory from the outcome scores, spread over its sampled tokens. Token-level ones (REINFORCE++, PPO)
override `token_advantages`: they see each trajectory's sampled tokens (their KL penalty, the critic's values).
Observation tokens are never time steps: every per-token quantity lives on the sampled tokens only.

The loss is PPO-clip with the chosen off-policy correction (`corrections.py`), an optional KL penalty to a frozen
reference (in the loss, or already in the reward: `kl.py`) and an entropy bonus:

    loss_t = -w * min(r * A, clip(r, 1 - eps_lo, 1 + eps_hi) * A)  + beta * KL_t [kl in the loss] - c_ent * entropy_t

Losses are returned per token (0 on masked tokens); the trainer sums them and divides by the number of loss tokens of
the whole (mini-)batch across ranks (a global token mean: long answers are not down-weighted per sequence).

Under staleness, the tokens and rewards come from the behaviour policy (the engine that sampled them); everything
the step computes itself (the critic's values, the KL in the reward, the proximal policy) comes from the learner's
weights at the step's start; the correction applies to the policy term only (the list is in `ppo.py`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from buffer.records import Group
from learner.algorithms.corrections import importance_weights
from learner.algorithms.kl import KLController, kl_estimate
from learner.algorithms.settings import CorrectionSettings, PolicyLossConfig


@dataclass
class BatchAdvantages:
    advantages: list[np.ndarray]  # one array per group, one value per trajectory
    zero_adv_groups: int  # groups whose scores were all identical (no gradient)


@dataclass
class TrajectoryTokens:
    """One trajectory of this rank's share, as the advantage estimators see it (arrays over the response)."""

    group: int  # index of its group in the batch
    sample: int  # index of the trajectory in its group
    loss_mask: np.ndarray  # 1 on sampled tokens (the time steps), 0 on observation tokens
    kl: np.ndarray | None = (
        None  # per-token KL estimate to the reference when the KL is in the reward (0 off-mask)
    )
    values: np.ndarray | None = None  # the critic's value of the state before each response token (PPO)


@dataclass
class AdvantageBatch:
    """What the step knows when advantages are computed; `groups` and `scores` are the whole batch on every rank."""

    groups: list[Group]
    rewards: list[np.ndarray]  # per group, per trajectory: the outcome reward after shaping (overlong)
    scores: list[
        np.ndarray
    ]  # rewards minus kl_coef * the trajectory's summed KL when the KL is in the reward
    trajectories: list[TrajectoryTokens]  # this rank's share
    kl_coef: float = 0.0  # the KL coefficient in the reward this step (0 when the KL is in the loss or off)
    all_reduce: Callable[[np.ndarray], np.ndarray] = lambda x: x  # element-wise sum over the learner ranks


@dataclass
class TokenAdvantages:
    advantages: list[np.ndarray]  # per trajectory of this rank's share, over its response (0 on observations)
    zero_adv_groups: int
    returns: list[np.ndarray] | None = None  # the critic's targets, same layout (PPO)


def sampled_only(values: np.ndarray, loss_mask: np.ndarray) -> np.ndarray:
    """The entries of a response-aligned array at the sampled tokens (the time steps), in order."""
    return np.asarray(values, dtype=np.float64)[np.asarray(loss_mask) > 0]


def spread_over_response(per_step: np.ndarray, loss_mask: np.ndarray) -> np.ndarray:
    """Back from sampled tokens to the response layout: observation tokens get 0."""
    out = np.zeros(len(loss_mask), dtype=np.float32)
    out[np.asarray(loss_mask) > 0] = per_step
    return out


def whiten(arrays: list[np.ndarray], all_reduce: Callable[[np.ndarray], np.ndarray], eps: float = 1e-8):
    """(x - mean) / sqrt(var + eps) with mean and unbiased variance over every entry of every rank's arrays."""
    flat = np.concatenate(arrays) if arrays else np.zeros(0)
    count, total, squares = all_reduce(
        np.array([flat.size, flat.sum(), np.square(flat).sum()], dtype=np.float64)
    )
    if count < 2:
        return [np.zeros_like(a) for a in arrays]
    mean = total / count
    var = max(squares - count * mean * mean, 0.0) / (count - 1)
    return [(a - mean) / np.sqrt(var + eps) for a in arrays]


def identical_score_groups(scores: list[np.ndarray]) -> int:
    """Groups of one sample or with identical scores: no group baseline, no gradient."""
    return sum(1 for s in scores if s.size <= 1 or np.all(s == s[0]))


def policy_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    staleness: torch.Tensor,
    loss_cfg: PolicyLossConfig,
    correction: CorrectionSettings,
    *,
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    proximal_logprobs: torch.Tensor | None = None,
    kl_coef: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss (0 where loss_mask is 0) and per-token statistics for the metrics.

    All inputs are 1-D over the same tokens. `proximal_logprobs` are the step's starting policy's when the step
    makes several updates (else the correction takes `logprobs` detached); `kl_coef` is the controller's value
    (default: the config's). Returns (loss_per_token, stats) where stats holds per-token tensors (`is_weight`,
    `clipped`, `masked`, `mismatch_kl`, `ratio`, `kl`) the trainer reduces over loss tokens.
    """
    mask = loss_mask.to(logprobs.dtype)
    behavior = behavior_logprobs.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype)
    if proximal_logprobs is not None:
        proximal_logprobs = proximal_logprobs.to(logprobs.dtype)
    log_ratio, weight, masked_out = importance_weights(
        correction, logprobs, behavior, staleness, proximal_logprobs
    )
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - loss_cfg.clip_low, 1.0 + loss_cfg.clip_high) * adv
    loss = -weight * torch.minimum(unclipped, clipped)
    coef = loss_cfg.kl_coef if kl_coef is None else kl_coef
    kl = torch.zeros_like(logprobs)
    if ref_logprobs is not None:
        kl = kl_estimate(logprobs, ref_logprobs.to(logprobs.dtype), loss_cfg.kl_estimator)
    if coef > 0 and loss_cfg.kl_placement == "loss":
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs from the frozen reference model")
        loss = loss + coef * kl
    if loss_cfg.entropy_coef > 0:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs the per-token entropy")
        loss = loss - loss_cfg.entropy_coef * entropy
    loss = loss * mask
    with torch.no_grad():
        # k3 estimate of KL(mu || theta) from tokens sampled by mu: the engine/trainer mismatch (plus staleness)
        delta = (logprobs - behavior).detach()
        stats = {
            "is_weight": weight,
            "clipped": ((clipped < unclipped) & ~masked_out).to(logprobs.dtype),
            "masked": masked_out.to(logprobs.dtype),
            "mismatch_kl": torch.exp(delta) - 1.0 - delta,
            "ratio": ratio.detach(),
            "kl": kl.detach(),
        }
    return loss, stats


class Algorithm(ABC):
    """An RL algorithm as the learner's step sees it. `cfg` is its member of the `learner.algorithm` union."""

    def __init__(self, cfg: PolicyLossConfig, correction: CorrectionSettings):
        self.cfg = cfg
        self.correction = correction
        self.kl_controller = KLController(cfg.kl_coef, cfg.kl_ctrl)

    @property
    def needs_reference(self) -> bool:
        """Whether the learner must keep a frozen copy of the initial policy (a KL penalty): its config's fact."""
        return self.cfg.needs_reference

    @property
    def needs_entropy(self) -> bool:
        """Whether the loss uses the per-token entropy with a gradient."""
        return self.cfg.entropy_coef > 0

    @property
    def needs_values(self) -> bool:
        """Whether the step needs a critic (its values before the step, its returns after): its config's fact."""
        return self.cfg.needs_critic

    def advantages(self, groups: list[Group], scores: list[np.ndarray] | None = None) -> BatchAdvantages:
        """One advantage per trajectory of every group from its outcome score (default: its reward)."""
        raise NotImplementedError(
            f"{type(self).__name__} computes advantages per token: use token_advantages"
        )

    @abstractmethod
    def token_advantages(self, batch: AdvantageBatch) -> TokenAdvantages:
        """Advantages of this rank's trajectories, over their responses (0 on observation tokens)."""

    def loss(
        self,
        logprobs: torch.Tensor,
        behavior_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        loss_mask: torch.Tensor,
        staleness: torch.Tensor,
        *,
        entropy: torch.Tensor | None = None,
        ref_logprobs: torch.Tensor | None = None,
        proximal_logprobs: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return policy_loss(
            logprobs,
            behavior_logprobs,
            advantages,
            loss_mask,
            staleness,
            self.cfg,
            self.correction,
            entropy=entropy,
            ref_logprobs=ref_logprobs,
            proximal_logprobs=proximal_logprobs,
            kl_coef=self.kl_controller.value,
        )

    # -- state that a checkpoint keeps (the adaptive KL coefficient) ------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"kl_coef": self.kl_controller.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "kl_coef" in state:
            self.kl_controller.value = float(state["kl_coef"])


class SequenceAlgorithm(Algorithm):
    """An algorithm whose advantage is one number per trajectory, from the scores of its group."""

    @abstractmethod
    def advantages(self, groups: list[Group], scores: list[np.ndarray] | None = None) -> BatchAdvantages:
        """One advantage per trajectory of every group (scores default to the groups' rewards)."""

    def token_advantages(self, batch: AdvantageBatch) -> TokenAdvantages:
        """One value per trajectory, from the whole batch's scores, on each of its sampled tokens."""
        result = self.advantages(batch.groups, batch.scores)
        per_token = [
            np.asarray(t.loss_mask, dtype=np.float32) * np.float32(result.advantages[t.group][t.sample])
            for t in batch.trajectories
        ]
        return TokenAdvantages(per_token, result.zero_adv_groups)
