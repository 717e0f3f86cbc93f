"""The KL term to a frozen reference: per-token estimators and the coefficient's controller.

Estimators of KL(pi || pi_ref) from a token sampled by pi, with log-ratio k = log pi(a) - log pi_ref(a)
(Schulman 2020, "Approximating KL divergence"):

| `kl_estimator` | per token                              | note                                               |
|---|---|---|
| `k1`           | k                                      | unbiased, high variance, can be negative (verl `kl`)|
| `k2`           | k^2 / 2                                | biased, low variance (verl `mse`)                   |
| `k3`           | exp(-k) + k - 1                        | unbiased, always >= 0                               |
| `low_var_kl`   | k3 clamped to [-10, 10]                | GRPO's and Search-R1's `low_var_kl`                 |

The controller (Ziegler et al. 2019, section 2.2, as Search-R1's `algorithm.kl_ctrl`): `fixed` keeps the
coefficient; `adaptive` multiplies it after every step by 1 + clip(kl / target - 1, -0.2, 0.2) * n / horizon, with
kl the step's mean KL per loss token and n its number of trajectories.
"""

from __future__ import annotations

import numpy as np
import torch

from learner.algorithms.settings import KLControlConfig, KLEstimator


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) (see the module table); gradients flow through `logprobs`."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    k3 = torch.exp(-log_ratio) + log_ratio - 1.0
    if estimator == "k3":
        return k3
    if estimator == "low_var_kl":
        return k3.clamp(-10.0, 10.0)
    raise ValueError(f"unknown kl_estimator {estimator!r}; expected k1, k2, k3 or low_var_kl")


def low_var_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi_theta || pi_ref) from samples of pi_theta, clamped to [-10, 10]."""
    return kl_estimate(logprobs, ref_logprobs, "low_var_kl")


class KLController:
    """The KL coefficient, fixed or adapted towards `target_kl` after every step."""

    def __init__(self, coef: float, cfg: KLControlConfig):
        self.value = float(coef)
        self.cfg = cfg

    def update(self, kl: float, trajectories: int) -> None:
        if self.cfg.type == "fixed" or not np.isfinite(kl):
            return
        error = float(np.clip(kl / self.cfg.target_kl - 1.0, -0.2, 0.2))
        self.value *= 1.0 + error * trajectories / self.cfg.horizon
