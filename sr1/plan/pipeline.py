"""One configuration to simulate: the split, the step's shape and the staleness bound (`splits.pipeline` reads it
from a root config)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pipeline:
    """One configuration to simulate: the split, the step's shape and the bound."""

    engines: int
    ranks: int
    groups_per_step: int
    group_size: int
    max_staleness: int
    max_turns: int = 4
    max_tokens_per_turn: int = 500
    max_obs_tokens: int = 500
    max_response_tokens: int = 4096
    max_inflight_groups: int = 128
    # most groups one claim reads; 1 deals a batch evenly over the engines, as veRL's rollout workers share it
    claim_batch_groups: int = 16
    max_num_seqs: int = 512
    ppo_epochs: int = 1
    ppo_mini_batch_size: int | None = None  # trajectories per optimizer update (None: the whole batch)
    checkpoint_every: int = 10**9
    dynamic_sampling: bool = False
    shared_gpu: bool = False  # every engine shares its GPU with a learner rank (engines == ranks)
