"""RL algorithms as components of the learner's step (`base.py` is the contract).

    algorithm = build_algorithm(cfg.learner.algorithm, cfg.learner.correction)

| `learner.algorithm.type` | file | advantages |
|---|---|---|
| `grpo` | `grpo.py` | (r - mean) / std within the group |
| `drgrpo` | `grpo.py` | r - mean within the group |
| `rloo` | `rloo.py` | r - mean of the group's other samples |
| `reinforce_baseline` | `reinforce.py` | r - mean within the group, normalised over the batch's tokens |
| `reinforce_pp` | `reinforce.py` | returns-to-go of the reward with a per-token KL penalty, normalised over the batch |
| `ppo` | `ppo.py` | GAE over the sampled tokens with a critic (`learner/critic.py`), normalised over the batch |

Off-policy corrections (`learner.correction.type`: none, tis, icepop, decoupled) are in `corrections.py`; the KL
estimators and controller in `kl.py`; DAPO's reward shaping in `shaping.py`; the config members in `settings.py`.
`ALGORITHMS` below pairs each config member with its class: adding an algorithm is its file here, its config member
in `settings.py` (in the `AlgorithmConfig` union) and its line in `ALGORITHMS`.
"""

from __future__ import annotations

from learner.algorithms.base import (
    AdvantageBatch,
    Algorithm,
    BatchAdvantages,
    TokenAdvantages,
    TrajectoryTokens,
    policy_loss,
)
from learner.algorithms.grpo import GRPO, DrGRPO
from learner.algorithms.kl import kl_estimate, low_var_kl
from learner.algorithms.ppo import PPO
from learner.algorithms.reinforce import ReinforceBaseline, ReinforcePP
from learner.algorithms.rloo import RLOO
from learner.algorithms.settings import (
    AlgorithmConfig,
    CorrectionConfig,
    DrGRPOConfig,
    GRPOConfig,
    PolicyLossConfig,
    PPOConfig,
    ReinforceBaselineConfig,
    ReinforcePPConfig,
    RLOOConfig,
)

__all__ = [
    "ALGORITHMS",
    "AdvantageBatch",
    "Algorithm",
    "BatchAdvantages",
    "TokenAdvantages",
    "TrajectoryTokens",
    "build_algorithm",
    "kl_estimate",
    "low_var_kl",
    "policy_loss",
]


# each member of the `learner.algorithm` union and the class `build_algorithm` makes of it
ALGORITHMS: dict[type[PolicyLossConfig], type[Algorithm]] = {
    GRPOConfig: GRPO,
    DrGRPOConfig: DrGRPO,
    RLOOConfig: RLOO,
    ReinforcePPConfig: ReinforcePP,
    ReinforceBaselineConfig: ReinforceBaseline,
    PPOConfig: PPO,
}


def build_algorithm(cfg: AlgorithmConfig, correction: CorrectionConfig) -> Algorithm:
    """The algorithm of `cfg` (a member of the `learner.algorithm` union), with its correction; TypeError naming the
    known algorithms for any other config."""
    cls = ALGORITHMS.get(type(cfg))
    if cls is None:
        known = ", ".join(member.model_fields["type"].default for member in ALGORITHMS)
        raise TypeError(f"no algorithm is built from {type(cfg).__name__}; known algorithms: {known}")
    return cls(cfg, correction)
