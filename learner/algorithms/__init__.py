"""RL algorithms as components of the learner's step (`base.py` is the contract).

    algorithm = build_algorithm(cfg.learner.algorithm, cfg.learner.correction)

| `learner.algorithm.type` | file | advantages |
|---|---|---|
| `grpo` | `grpo.py` | (r - mean) / std within the group |
| `drgrpo` | `grpo.py` | r - mean within the group |

Off-policy corrections (`learner.correction.type`: none, tis, icepop, decoupled) are in `corrections.py`; the
config members of both unions in `settings.py`.
"""

from __future__ import annotations

from learner.algorithms.base import Algorithm, BatchAdvantages, low_var_kl, policy_loss
from learner.algorithms.settings import AlgorithmConfig, CorrectionConfig

__all__ = ["Algorithm", "BatchAdvantages", "build_algorithm", "low_var_kl", "policy_loss"]


def build_algorithm(cfg: AlgorithmConfig, correction: CorrectionConfig) -> Algorithm:
    """The algorithm `cfg` (a member of the `learner.algorithm` union) names, with its correction."""
    from config.imports import import_object  # here: the config package imports this package's settings

    return import_object(cfg.implementation)(cfg, correction)
