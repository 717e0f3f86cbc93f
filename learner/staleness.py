"""Staleness on the learner's side: the bounds a step keeps and their check (`StepBounds`, `check_staleness`), how far
the behaviour policy is from the learner's (`offpolicy_stats`, `effective_sample_size`), and
`learner.max_staleness: auto`, where the bound follows that off-policy mismatch:

    controller = StalenessController(cfg.learner.staleness_auto)
    bound = controller.bound                           # for the first versions
    bound = controller.observe(train_metrics)          # after each step: the bound of releases from the next version

The signal is the step's `loss/offpolicy_kl` (k3 KL of the behaviour policy to the learner's at the step's start, on
the loss tokens: staleness and engine mismatch, not the step's own updates), and `loss/is_ess` when `min_ess` is set. Above target the bound is halved (multiplicative decrease, not below `floor`),
at every step that is over target: the policy can run away from its data within a few steps (measured on the
`tiny-offpolicy` preset, docs/algorithms.md), so a decrease never waits. After a decrease the bound does not rise
again for as many steps as the old bound: groups released under it are still being trained for that long
(buffer/admission.py, "A bound that changes"), so their being within target says nothing about a larger bound yet.
Otherwise, within target for `patience` steps in a row, the bound rises by one (additive increase, not above
`ceiling`). The
controller only proposes bounds; admission applies them at step boundaries, to prompts released from the next version
on, so the bound of every release (and with it each step's bound in force) is fixed before anything is sampled under
it. Its state goes into every checkpoint (`state_dict`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

from buffer.records import Group
from learner.settings import StalenessAutoConfig


class StalenessError(RuntimeError):
    """A batch holds a loss token older than the staleness bound: admission control was bypassed."""


@dataclasses.dataclass(frozen=True)
class StepBounds:
    """The staleness bounds a step keeps (buffer/admission.py, "A bound that changes"): `in_force`, the bound in force
    for the step (`staleness/bound`), and `by_release`, release version -> the bound prompts released at it were given.
    A fixed `learner.max_staleness` is `StepBounds(s)`; rank 0 sends the others its schedule's figures."""

    in_force: int
    by_release: dict[int, int] = dataclasses.field(default_factory=dict)

    def of(self, group: Group) -> int:
        """The largest staleness a loss token of `group` may have at this step."""
        return min(self.in_force, self.by_release.get(group.release_version, self.in_force))

    def to_json(self) -> dict:
        return {"in_force": self.in_force, "by_release": {str(k): v for k, v in self.by_release.items()}}

    @classmethod
    def from_json(cls, data: dict) -> StepBounds:
        return cls(int(data["in_force"]), {int(k): int(v) for k, v in data.get("by_release", {}).items()})


def batch_staleness(groups: list[Group], version: int) -> np.ndarray:
    """Per loss token: learner version of this step - version that sampled the token."""
    parts = [version - t.sampled_versions() for g in groups for t in g.trajectories]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def check_staleness(groups: list[Group], version: int, max_staleness: int | StepBounds) -> np.ndarray:
    """Per-token staleness of the batch; raise StalenessError if a loss token is older than its bound: the bound its
    prompt was released under, and the bound in force for the step (`max_staleness`: one bound for every token, or
    a step's StepBounds)."""
    bounds = StepBounds(max_staleness) if isinstance(max_staleness, int) else max_staleness
    for g in groups:
        oldest = g.min_version()
        if oldest is None:
            continue
        allowed = bounds.of(g)
        if version - oldest > allowed:
            released = bounds.by_release.get(g.release_version)
            raise StalenessError(
                f"batch at version {version} has a token {version - oldest} versions old in group {g.group_id}, "
                f"more than its bound {allowed} (bound in force {bounds.in_force}; released at version "
                f"{g.release_version}" + (f" under bound {released}" if released is not None else "") + ")"
            )
    return batch_staleness(groups, version)


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


class StalenessController:
    def __init__(self, cfg: StalenessAutoConfig):
        self.cfg = cfg
        self.bound = cfg.start
        self.hold = 0  # steps left during which the bound does not rise (after a decrease)
        self.within = 0  # steps in a row within target

    def over_target(self, metrics: dict[str, Any]) -> bool:
        """Whether a step's mismatch calls for a lower bound (a non-finite measure counts as over)."""
        kl = float(metrics.get("loss/offpolicy_kl", 0.0))
        if not math.isfinite(kl) or kl > self.cfg.target_kl:
            return True
        if self.cfg.min_ess is not None:
            ess = float(metrics.get("loss/is_ess", 1.0))
            return not math.isfinite(ess) or ess < self.cfg.min_ess
        return False

    def observe(self, metrics: dict[str, Any]) -> int:
        """Read one step's metrics; return the bound for prompts released from the next version on."""
        cfg = self.cfg
        holding = self.hold > 0
        if holding:
            self.hold -= 1
        if self.over_target(metrics):
            self.within = 0
            lower = max(cfg.floor, self.bound // 2)
            if lower < self.bound:
                self.hold = self.bound
                self.bound = lower
            return self.bound
        if holding:
            return self.bound
        self.within += 1
        if self.within >= cfg.patience and self.bound < cfg.ceiling:
            self.bound += 1
            self.within = 0
        return self.bound

    def state_dict(self) -> dict[str, int]:
        return {"bound": self.bound, "hold": self.hold, "within": self.within}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint's state; a bound outside this config's [floor, ceiling] is brought inside."""
        if "bound" in state:
            self.bound = min(max(int(state["bound"]), self.cfg.floor), self.cfg.ceiling)
        self.hold = int(state.get("hold", 0))
        self.within = int(state.get("within", 0))
