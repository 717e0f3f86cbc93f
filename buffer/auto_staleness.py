"""`learner.max_staleness: {auto: ...}`: a staleness bound that follows the measured off-policy mismatch.

    learner:
      max_staleness: auto                                # auto's defaults: floor 0, ceiling 8, target_kl 0.05
      max_staleness: {auto: {floor: 1, ceiling: 16, target_kl: 0.05, patience: 2}}

Its knobs (`StalenessAutoConfig`, inside the `{auto: ...}` section `AutoStaleness`) and the controller that reads each
step's `loss/offpolicy_kl` (and `loss/is_ess`) and proposes the bound of the next release version
(`StalenessController`). Nothing here applies a bound: buffer/staleness.py parses the key (`MaxStaleness`), keeps
the bound of every release version (`StalenessSchedule`, `StalenessKeeper`) and checks it; docs/staleness.md says
why a moving bound still holds.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

# -- the knobs: the `auto` section


class StalenessAutoConfig(BaseModel):
    """How `learner.max_staleness: {auto: ...}` moves the bound (`StalenessController`). After each step the learner
    reads the step's off-policy mismatch: above target it halves the bound (not below `floor`), at every step over
    target, and does not raise it again for as many steps as the old bound (the groups released under it are still
    being trained); within target for `patience` steps in a row it raises the bound by one (not above `ceiling`).
    New bounds apply to prompts released from the next version on."""

    model_config = ConfigDict(extra="forbid")

    floor: int = Field(0, ge=0, description="The lowest bound auto may set (0: synchronous, on-policy).")
    ceiling: int = Field(8, ge=0, description="The highest bound auto may set.")
    initial: int | None = Field(
        None, ge=0, description="The bound of the first steps (None: floor); must lie in [floor, ceiling]."
    )
    target_kl: float = Field(
        0.05,
        gt=0,
        description="The largest `loss/offpolicy_kl` (k3 KL of the behaviour policy to the learner's at the step's "
        "start, per loss token) a step may show before the bound is lowered.",
    )
    min_ess: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Also lower the bound when `loss/is_ess` (effective sample size of the importance weights, "
        "0 to 1) falls below this (None: the KL alone decides).",
    )
    patience: int = Field(
        2, ge=1, description="Steps in a row within target before the bound is raised by one."
    )

    @model_validator(mode="after")
    def _range(self) -> StalenessAutoConfig:
        where = "learner.max_staleness.auto"
        if self.floor > self.ceiling:
            raise ValueError(f"{where}.floor ({self.floor}) must be <= {where}.ceiling ({self.ceiling})")
        if self.initial is not None and not self.floor <= self.initial <= self.ceiling:
            raise ValueError(
                f"{where}.initial ({self.initial}) must lie in [floor, ceiling] = [{self.floor}, {self.ceiling}]"
            )
        return self

    @property
    def start(self) -> int:
        return self.floor if self.initial is None else self.initial


class AutoStaleness(BaseModel):
    """`learner.max_staleness: {auto: {...}}`: a bound that follows the measured off-policy mismatch."""

    model_config = ConfigDict(extra="forbid")

    auto: StalenessAutoConfig = Field(
        default_factory=StalenessAutoConfig,
        description="How the bound moves: {floor, ceiling, initial, target_kl, min_ess, patience}.",
    )


# -- the controller: multiplicative decrease, additive increase


class StalenessController:
    """`learner.max_staleness: {auto: ...}`: proposes the bound of the next release version from each step's
    `loss/offpolicy_kl` (and `loss/is_ess` with `min_ess`): multiplicative decrease at every step over target (the
    policy can run away from its data within a few steps), no rise for as many steps as the old bound after a
    decrease, additive increase after `patience` steps in a row within target.

        controller = StalenessController(cfg.learner.max_staleness.auto)
        bound = controller.observe(train_metrics)    # after each step: the bound of releases from the next version
    """

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
