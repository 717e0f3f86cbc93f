"""The learner step's statistics: summed per micro-batch, reduced over ranks, and the metrics the step returns.

What each micro-batch adds stays on the device (nothing is read back inside the micro-batch loop); the totals are
reduced over ranks once, at the step's end, and become the metrics `Learner.train_step` returns (learner/trainer.py;
the keys are documented in docs/metrics.md).

    totals = StepTotals.zeros(world.device)
    totals.add(stats)                                   # per micro-batch: the policy loss's per-token statistics
    totals.add_critic(value_loss, stats, loss_mask)     # per micro-batch: the critic's
    reduced = totals.reduce(world)                      # once per step, on every rank (collective)
    metrics = step_metrics(reduced, totals, lr=..., ...) | critic_metrics(totals, ..., sum_over_ranks)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch

from buffer.records import Group
from buffer.staleness import StepBounds
from learner.algorithms.corrections import effective_sample_size
from learner.algorithms.shaping import truncated
from learner.distributed import World, all_reduce
from learner.minibatches import MiniBatch

# per-token statistics summed over loss tokens (then divided by their count), in all-reduce order
_SUM_KEYS = [
    "pg_loss",
    "is_weight",
    "clipped",
    "masked",
    "mismatch_kl",
    "entropy",
    "kl",
    "staleness",
    "start_tokens",
    "start_kl",
    "start_weight",
    "start_weight_sq",
]
_MAX_KEYS = ["is_weight", "staleness", "ratio"]
_CRITIC_KEYS = ["value_loss", "value_clipped", "value", "return"]


def _mean(values: list[torch.Tensor]) -> float:
    """The mean of 0-d device tensors, read back once (0 when there are none)."""
    return float(torch.stack(values).double().mean()) if values else 0.0


@dataclasses.dataclass
class ReducedTotals:
    """A step's totals over every rank, read back: per-token sums, their means over loss tokens, the maxima."""

    sums: dict[str, float]
    mean: dict[str, float]
    peak: dict[str, float]
    model_tokens: float  # tokens through the policy on all ranks
    denominator: float  # loss tokens over all updates and ranks (at least 1)


@dataclasses.dataclass
class StepTotals:
    """Sums and maxima over every update of the step, reduced over ranks at its end."""

    sums: torch.Tensor
    maxes: torch.Tensor
    critic: torch.Tensor
    tokens: float = 0.0  # loss tokens over all updates and ranks (the denominator of `sums`)
    model_tokens: int = 0  # tokens through the policy on this rank
    grad_norms: list[torch.Tensor] = dataclasses.field(default_factory=list)  # 0-d, on the device
    critic_grad_norms: list[torch.Tensor] = dataclasses.field(default_factory=list)
    skipped_updates: int = 0  # policy updates skipped for a non-finite loss or gradient norm

    @classmethod
    def zeros(cls, device: torch.device) -> StepTotals:
        return cls(
            sums=torch.zeros(len(_SUM_KEYS), dtype=torch.float64, device=device),
            maxes=torch.full((len(_MAX_KEYS),), -1e30, dtype=torch.float64, device=device),
            critic=torch.zeros(len(_CRITIC_KEYS), dtype=torch.float64, device=device),
        )

    def add(self, stats: dict[str, torch.Tensor]) -> None:
        """Add a micro-batch's statistics over its loss tokens, on the device (no value is read back here)."""
        mask = stats["loss_mask"] > 0
        if mask.numel() == 0:
            return
        for i, key in enumerate(_SUM_KEYS):
            self.sums[i] += torch.where(mask, stats[key].double(), 0.0).sum()
        for i, key in enumerate(_MAX_KEYS):
            self.maxes[i] = torch.maximum(
                self.maxes[i], torch.where(mask, stats[key].double(), -torch.inf).max()
            )

    def add_critic(
        self, value_loss: torch.Tensor, stats: dict[str, torch.Tensor], loss_mask: torch.Tensor
    ) -> None:
        """Add a micro-batch's value loss and the critic's statistics over its loss tokens, on the device."""
        mask = loss_mask > 0
        self.critic += torch.stack(
            [
                value_loss.detach().double(),
                *(
                    torch.where(mask, stats[k].double(), 0.0).sum()
                    for k in ("value_clipped", "value", "return")
                ),
            ]
        )

    def reduce(self, world: World) -> ReducedTotals:
        """The totals summed (maxima: maxed) over ranks, in place, and read back; every rank calls it."""
        all_reduce(self.sums, world, "sum")
        all_reduce(self.maxes, world, "max")
        all_reduce(self.critic, world, "sum")
        model_tokens = torch.tensor([self.model_tokens], dtype=torch.float64, device=world.device)
        all_reduce(model_tokens, world, "sum")
        denominator = max(self.tokens, 1.0)
        sums = dict(zip(_SUM_KEYS, self.sums.tolist(), strict=True))
        mean = {k: float(v) / denominator for k, v in sums.items()}
        peak = dict(zip(_MAX_KEYS, self.maxes.tolist(), strict=True))
        return ReducedTotals(sums, mean, peak, float(model_tokens.item()), denominator)


def step_metrics(
    reduced: ReducedTotals,
    totals: StepTotals,
    *,
    lr: float,
    kl_coef: float,
    staleness: np.ndarray,
    bounds: StepBounds,
    groups: list[Group],
    rewards: list[np.ndarray],
    zero_adv_groups: int,
    updates: list[MiniBatch],
    ppo_epochs: int,
    elapsed: float,
    version: int,
) -> dict[str, float]:
    """The step's metrics (docs/metrics.md, "Learner step"): the loss and correction statistics, the batch, timing.
    `staleness`: per loss token (buffer/staleness.py); `rewards`: after DAPO's shaping; `version`: after the step."""
    mean, peak, sums = reduced.mean, reduced.peak, reduced.sums
    raw = np.concatenate([g.rewards for g in groups]) if groups else np.zeros(1)
    shaped = np.concatenate(rewards) if groups else np.zeros(1)
    trajectories = [t for g in groups for t in g.trajectories]
    return {
        "loss/pg": mean["pg_loss"],
        "loss/entropy": mean["entropy"],
        "loss/kl_ref": mean["kl"],
        "loss/mismatch_kl": mean["mismatch_kl"],
        "loss/clipped_frac": mean["clipped"],
        "loss/masked_frac": mean["masked"],
        "loss/ratio_max": peak["ratio"],
        "is/weight_mean": mean["is_weight"],
        "is/weight_max": peak["is_weight"],
        "loss/offpolicy_kl": sums["start_kl"] / max(sums["start_tokens"], 1.0),
        "loss/is_ess": effective_sample_size(
            sums["start_weight"], sums["start_weight_sq"], sums["start_tokens"]
        ),
        "loss/grad_norm": _mean(totals.grad_norms),
        "loss/nonfinite_skipped": 1.0 if totals.skipped_updates else 0.0,
        "loss/lr": lr,
        "kl/coef": kl_coef,
        "staleness/mean": float(staleness.mean()) if staleness.size else 0.0,
        "staleness/max": int(staleness.max()) if staleness.size else 0,
        "staleness/bound": bounds.in_force,
        "batch/reward_mean": float(raw.mean()),
        "batch/overlong_penalty_mean": float((shaped - raw).mean()),
        "batch/truncated_frac": float(np.mean([truncated(t) for t in trajectories])) if trajectories else 0.0,
        "batch/zero_adv_groups": zero_adv_groups,
        "batch/groups": len(groups),
        "batch/loss_tokens": int(max(sum(m.loss_tokens for m in updates), 1.0)),
        "batch/tool_calls_per_traj": float(np.mean([t.info.get("tool_calls", 0) for t in trajectories]))
        if trajectories
        else 0.0,
        "batch/response_len_mean": float(np.mean([len(t.response_ids) for t in trajectories]))
        if trajectories
        else 0.0,
        "perf/train_s": elapsed,
        "perf/tokens_per_s": reduced.model_tokens / elapsed,
        "perf/micro_batches": sum(len(m.micro_batches) for m in updates),
        "perf/updates": len(updates) * ppo_epochs,
        "learner/version": version,
    }


def critic_metrics(
    totals: StepTotals,
    lr: float | None,
    updates: list[MiniBatch],
    denominator: float,
    sum_over_ranks: Callable[[np.ndarray], np.ndarray],
) -> dict[str, float]:
    """The value loss and the critic's fit: explained variance of the returns by the values before the step
    (`totals` already reduced; `sum_over_ranks` is a collective)."""
    mean = {k: float(v) / denominator for k, v in zip(_CRITIC_KEYS, totals.critic.tolist(), strict=True)}
    moments = np.zeros(5)  # count, sum R, sum R^2, sum (R - V), sum (R - V)^2 over sampled tokens
    for mini in updates:
        for part in mini.micro_batches:
            mask = part.mb.loss_mask[part.mb.keep].to(part.returns.device) > 0
            returns, values = part.returns[mask].double(), part.old_values[mask].double()
            error = returns - values
            moments += np.array(
                [
                    mask.sum().item(),
                    returns.sum().item(),
                    returns.square().sum().item(),
                    error.sum().item(),
                    error.square().sum().item(),
                ]
            )
    count, r_sum, r_sq, e_sum, e_sq = sum_over_ranks(moments)
    explained = 0.0
    if count > 1:
        var_returns = (r_sq - r_sum * r_sum / count) / (count - 1)
        var_error = (e_sq - e_sum * e_sum / count) / (count - 1)
        explained = float(1.0 - var_error / var_returns) if var_returns > 1e-12 else 0.0
    return {
        "critic/value_loss": mean["value_loss"],
        "critic/clipped_frac": mean["value_clipped"],
        "critic/value_mean": mean["value"],
        "critic/return_mean": mean["return"],
        "critic/explained_var": explained,
        "critic/grad_norm": _mean(totals.critic_grad_norms),
        "critic/lr": lr,
    }
