"""`learner.max_staleness: auto`: the staleness bound follows the off-policy mismatch the learner measures.

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

import math
from typing import Any

from learner.settings import StalenessAutoConfig


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
