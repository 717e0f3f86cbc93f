"""Group-relative advantages: GRPO and Dr. GRPO.

GRPO (Shao et al. 2024, DeepSeekMath section 4.1.2): A_i = (r_i - mean(r)) / (std(r) + eps) within the n samples of
one prompt. Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training") drops the std division, which
over-weights groups that are almost all right or all wrong; unlike the paper, the loss stays the batch's global token
mean (the paper also drops the per-sequence length normalisation, which a global token mean never had). A group
whose scores are all equal carries no signal: every advantage is exactly 0, so it contributes no gradient; it is
counted (`batch/zero_adv_groups`). With the KL in the reward, a trajectory's score is its reward minus kl_coef times
its summed KL (verl's way); by default the KL is a loss term, as in the paper.
"""

from __future__ import annotations

import numpy as np

from buffer.records import Group
from learner.algorithms.base import BatchAdvantages, SequenceAlgorithm, identical_score_groups


def group_advantages(rewards: np.ndarray, *, std_normalize: bool = True, eps: float = 1e-6) -> np.ndarray:
    """Advantages of one group's rewards: centred, and divided by the std when `std_normalize` (GRPO).

    The std is the unbiased sample std (ddof=1), as in the GRPO reference implementations; a group of one sample
    has no baseline and gets advantage 0.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    if rewards.size <= 1 or np.all(rewards == rewards[0]):
        return np.zeros_like(rewards)
    centred = rewards - rewards.mean()
    return centred / (rewards.std(ddof=1) + eps) if std_normalize else centred


class GRPO(SequenceAlgorithm):
    std_normalize = True

    def advantages(self, groups: list[Group], scores: list[np.ndarray] | None = None) -> BatchAdvantages:
        scores = [g.rewards for g in groups] if scores is None else scores
        return BatchAdvantages(
            advantages=[group_advantages(s, std_normalize=self.std_normalize) for s in scores],
            zero_adv_groups=identical_score_groups(scores),
        )


class DrGRPO(GRPO):
    std_normalize = False
