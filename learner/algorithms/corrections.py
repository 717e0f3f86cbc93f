"""Off-policy corrections: how the loss weighs a token sampled by an older policy (or by an engine whose numerics
differ from the learner's).

For a loss token with current log-prob l_theta (with gradient), behaviour log-prob l_mu (recorded by the engine that
sampled it) and proximal log-prob l_p (the learner's weights at the start of this step):

| correction  | ratio r               | weight w (detached)                                   |
|-------------|-----------------------|-------------------------------------------------------|
| `none`      | exp(l_theta - l_mu)   | 1                                                     |
| `tis`       | exp(l_theta - l_p)    | min(exp(l_p - l_mu), cap)          (truncated IS)     |
| `icepop`    | exp(l_theta - l_p)    | exp(l_p - l_mu) inside [low, high], else 0 (masked)   |
| `decoupled` | exp(l_theta - l_p)    | exp(l_p - l_mu), tokens with w > cap masked           |

`decoupled` is AReaL's decoupled PPO (Fu et al. 2025, "AReaL", eq. 5): like AReaL's `behav_imp_weight_cap` the cap
masks tokens instead of truncating them, which is where it differs from `tis`. The proximal log-probs come from the
learner's weights at the start of the step. When the step makes one optimizer update, a recomputing forward pass with
those weights gives exactly l_theta's values: `recompute` uses l_theta detached from the same forward (no second
pass). With several updates per step (`learner.ppo_mini_batch_size`, `learner.ppo_epochs`) the trainer computes them
once, before the first update, and passes them in (`proximal_logprobs`). `loglinear` is AReaL's approximation (docs/algorithms/prox_approx.md in AReaL): with per-token staleness
s = v - v_token, the proximal policy (version v) sits between the behaviour (v - s) and the policy after this step
(v + 1): l_p ~= l_mu + s / (s + 1) * (l_theta - l_mu).

How far off-policy a step is, whatever the correction: `offpolicy_stats` (per token) and `effective_sample_size`,
for `loss/offpolicy_kl` and `loss/is_ess` (what `learner.max_staleness: auto` steers by, buffer/auto_staleness.py).
"""

from __future__ import annotations

import torch

from learner.algorithms.settings import CorrectionSettings


def loglinear_proximal(
    logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, staleness: torch.Tensor
) -> torch.Tensor:
    """AReaL's log-linear proximal log-probs, alpha = s / (s + 1) per token (s clamped at 0)."""
    s = staleness.clamp(min=0).to(logprobs.dtype)
    alpha = s / (s + 1.0)
    return behavior_logprobs + alpha * (logprobs.detach() - behavior_logprobs)


def importance_weights(
    correction: CorrectionSettings,
    logprobs: torch.Tensor,
    behavior: torch.Tensor,
    staleness: torch.Tensor,
    recomputed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log ratio r, detached weight w, masked-out tokens) of the table above, per token. `recomputed`: the step's
    starting policy's log-probs when the step makes several updates (`recompute` then uses them)."""
    if not correction.uses_proximal:
        return logprobs - behavior, torch.ones_like(logprobs), torch.zeros_like(logprobs, dtype=torch.bool)
    if correction.proximal == "recompute":
        proximal = logprobs.detach() if recomputed is None else recomputed.detach()
    else:
        proximal = loglinear_proximal(logprobs, behavior, staleness)
    # each correction's own rule (its member's `weigh`: truncate, or mask outside a band or above a cap)
    weight, masked_out = correction.weigh(torch.exp(proximal - behavior))
    return logprobs - proximal, weight.detach(), masked_out


def offpolicy_stats(
    start_logprobs: torch.Tensor | None, behavior_logprobs: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Per token, how far the behaviour policy mu is from the policy the step starts from (pi_0: the proximal policy,
    before any of the step's updates): k3 KL(mu || pi_0) and the raw importance weight w = pi_0 / mu (before any
    truncation or masking, so the same under every correction) with its square, for `loss/offpolicy_kl` and
    `loss/is_ess`. Zero, and not counted (`start_tokens` 0), where pi_0's log-probs are not known (a later update
    of a step that computed no proximal pass)."""
    zeros = torch.zeros_like(behavior_logprobs, dtype=torch.float64)
    if start_logprobs is None:
        return {"start_tokens": zeros, "start_kl": zeros, "start_weight": zeros, "start_weight_sq": zeros}
    delta = (start_logprobs.detach().double() - behavior_logprobs.double()).clamp(
        -30.0, 30.0
    )  # e^60 is finite
    weight = torch.exp(delta)
    return {
        "start_tokens": zeros + 1.0,
        "start_kl": weight - 1.0 - delta,
        "start_weight": weight,
        "start_weight_sq": weight * weight,
    }


def effective_sample_size(weight_sum: float, weight_sq_sum: float, count: float) -> float:
    """(sum w)^2 / (n sum w^2): the share of n weighted samples that n unweighted ones are worth, in (0, 1] (1: every
    weight equal, on-policy; 1/n: one sample carries everything). 1 for no samples."""
    if count <= 0 or weight_sq_sum <= 0:
        return 1.0
    return float(min(1.0, weight_sum * weight_sum / (count * weight_sq_sum)))
