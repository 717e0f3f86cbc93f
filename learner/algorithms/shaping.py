"""DAPO's sampling and shaping options (Yu et al. 2025, "DAPO", sections 3.3 and 3.4), for every algorithm.

- Dynamic sampling (`dynamic_sampling`): a group whose rewards are all equal gives GRPO-style algorithms no gradient,
  so it is dropped when the learner takes it and its place is refilled by a new prompt (`informative`, used by the
  batch assembler in buffer/admission.py; the prompt feeder over-releases by the number of dropped groups, and the
  staleness bound still holds: see that module). DAPO over-samples a synchronous batch and filters it; here the
  stream is filtered as it arrives, so no generated group waits for a batch to fill.
- Overlong filtering (`overlong.mask_truncated`): a trajectory cut by the token budget is kept out of the loss.
- Soft overlong punishment (`overlong.buffer_tokens` = L_cache, budget L_max = `generators.max_response_tokens`):
  R_length(y) = 0 if |y| <= L_max - L_cache, ((L_max - L_cache) - |y|) / L_cache * penalty inside the buffer, and
  -penalty beyond. |y| counts the whole response (sampled and observation tokens): that is what the agent loop's
  budget limits, where DAPO (no tools) counts generated tokens.
"""

from __future__ import annotations

import numpy as np

from buffer.records import Group, Trajectory
from learner.algorithms.settings import OverlongConfig

TRUNCATED = "budget"  # the agent loop's finish reason for a trajectory cut by the token budget


def informative(group: Group) -> bool:
    """Whether a group's rewards differ (dynamic sampling keeps only these)."""
    rewards = group.rewards
    return rewards.size > 1 and not np.all(rewards == rewards[0])


def truncated(trajectory: Trajectory) -> bool:
    return trajectory.info.get("finish_reason") == TRUNCATED


def overlong_penalty(length: int, budget: int, buffer_tokens: int, penalty: float) -> float:
    """DAPO's soft overlong punishment of a response of `length` tokens (0 when `buffer_tokens` is 0)."""
    if buffer_tokens <= 0:
        return 0.0
    start = budget - buffer_tokens
    if length <= start:
        return 0.0
    if length <= budget:
        return (start - length) / buffer_tokens * penalty
    return -penalty


def shaped_rewards(groups: list[Group], cfg: OverlongConfig, budget: int | None) -> list[np.ndarray]:
    """Each group's rewards plus the soft overlong punishment (the rewards themselves when it is off)."""
    if cfg.buffer_tokens <= 0:
        return [g.rewards for g in groups]
    if budget is None:
        raise ValueError(
            "overlong.buffer_tokens > 0 needs the response token budget (generators.max_response_tokens)"
        )
    return [
        g.rewards
        + np.array(
            [
                overlong_penalty(len(t.response_ids), budget, cfg.buffer_tokens, cfg.penalty)
                for t in g.trajectories
            ]
        )
        for g in groups
    ]
