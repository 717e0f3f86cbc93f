"""RLOO: REINFORCE with a leave-one-out baseline (Ahmadian et al. 2024, "Back to Basics", section 3.2; Kool et al.
2019).

A_i = r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean(r)) within the n samples of a prompt: each sample's
baseline is the others' mean, so it does not depend on the sample itself (unbiased), and, unlike GRPO, the scale is
not divided by the group's std. How it differs from the paper: the paper's update is plain REINFORCE on the whole
sequence; here it goes through the same PPO-clip loss (with one update per batch the ratio is 1 at the start, so the
first-order gradient is the paper's) and the batch's global token mean, with the chosen off-policy correction. A group
of one sample has no baseline (advantage 0); groups whose scores are all equal give 0 and are counted.
"""

from __future__ import annotations

import numpy as np

from buffer.records import Group
from learner.algorithms.base import BatchAdvantages, SequenceAlgorithm, identical_score_groups


def leave_one_out_advantages(scores: np.ndarray) -> np.ndarray:
    """r_i minus the mean of the group's other scores (0 for a group of one)."""
    scores = np.asarray(scores, dtype=np.float64)
    n = scores.size
    if n <= 1:
        return np.zeros_like(scores)
    return (scores - (scores.sum() - scores) / (n - 1)).astype(np.float64)


class RLOO(SequenceAlgorithm):
    def advantages(self, groups: list[Group], scores: list[np.ndarray] | None = None) -> BatchAdvantages:
        scores = [g.rewards for g in groups] if scores is None else scores
        return BatchAdvantages(
            advantages=[leave_one_out_advantages(s) for s in scores],
            zero_adv_groups=identical_score_groups(scores),
        )
