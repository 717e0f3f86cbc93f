"""What an algorithm supplies to the learner's step: advantages for a batch of groups and a per-token loss.

    algorithm = build_algorithm(cfg.learner.algorithm, cfg.learner.correction)   # learner/algorithms/__init__.py
    advantages = algorithm.advantages(groups)      # one array per group, one value per trajectory
    per_token, stats = algorithm.loss(logprobs, behavior, adv, loss_mask, staleness, entropy=..., ref_logprobs=...)

The loss is PPO-clip with the chosen off-policy correction (`corrections.py`), an optional low-variance KL penalty
to a frozen reference and an entropy bonus:

    loss_t = -w * min(r * A, clip(r, 1 - eps_lo, 1 + eps_hi) * A)  + beta * low_var_kl_t - c_ent * entropy_t

Losses are returned per token (0 on masked tokens); the trainer sums them and divides by the number of loss tokens of
the whole batch across ranks (a global token mean: long answers are not down-weighted per sequence).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from buffer.records import Group
from learner.algorithms.corrections import importance_weights
from learner.algorithms.settings import CorrectionConfig, PolicyLossConfig


@dataclass
class BatchAdvantages:
    advantages: list[np.ndarray]  # one array per group, one value per trajectory
    zero_adv_groups: int  # groups whose rewards were all identical (no gradient)


def low_var_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi_theta || pi_ref) from samples of pi_theta (Schulman 2020), clamped to [-10, 10]."""
    log_ratio = ref_logprobs - logprobs
    return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-10.0, 10.0)


def policy_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    staleness: torch.Tensor,
    loss_cfg: PolicyLossConfig,
    correction: CorrectionConfig,
    *,
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss (0 where loss_mask is 0) and per-token statistics for the metrics.

    All inputs are 1-D over the same tokens. Returns (loss_per_token, stats) where stats holds per-token tensors
    (`is_weight`, `clipped`, `masked`, `mismatch_kl`, `ratio`, `kl`) the trainer reduces over loss tokens.
    """
    mask = loss_mask.to(logprobs.dtype)
    behavior = behavior_logprobs.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype)
    log_ratio, weight, masked_out = importance_weights(correction, logprobs, behavior, staleness)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - loss_cfg.clip_low, 1.0 + loss_cfg.clip_high) * adv
    loss = -weight * torch.minimum(unclipped, clipped)
    kl = torch.zeros_like(logprobs)
    if loss_cfg.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs from the frozen reference model")
        kl = low_var_kl(logprobs, ref_logprobs.to(logprobs.dtype))
        loss = loss + loss_cfg.kl_coef * kl
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

    def __init__(self, cfg: PolicyLossConfig, correction: CorrectionConfig):
        self.cfg = cfg
        self.correction = correction

    @property
    def needs_reference(self) -> bool:
        """Whether the learner must keep a frozen copy of the initial policy (a KL penalty)."""
        return self.cfg.kl_coef > 0

    @property
    def needs_entropy(self) -> bool:
        """Whether the loss uses the per-token entropy with a gradient."""
        return self.cfg.entropy_coef > 0

    @abstractmethod
    def advantages(self, groups: list[Group]) -> BatchAdvantages:
        """One advantage per trajectory of every group."""

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
        )
