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
Each config member builds its own class and owns its facts (`needs_critic`, `group_baseline`, `needs_reference`):
adding an algorithm is its file here and its member in `settings.py`, registered in the `ALGORITHMS` family
(`common/variants.py`); nothing else names it.
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
from learner.algorithms.kl import kl_estimate, low_var_kl
from learner.algorithms.settings import (
    ALGORITHMS,
    AlgorithmConfig,
    CorrectionConfig,
    PolicyLossConfig,
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


def build_algorithm(cfg: AlgorithmConfig, correction: CorrectionConfig) -> Algorithm:
    """The algorithm of `cfg` (a member of the `learner.algorithm` family), with its correction; TypeError naming the
    known algorithms for any other config."""
    if not isinstance(cfg, PolicyLossConfig) or ALGORITHMS.members.get(cfg.type) is not type(cfg):
        raise TypeError(
            f"no algorithm is built from {type(cfg).__name__}; known algorithms: {ALGORITHMS.known()}"
        )
    return cfg.build(correction)
