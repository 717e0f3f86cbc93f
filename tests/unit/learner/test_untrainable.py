"""Which groups the learner dead-letters instead of training (`learner.packing.untrainable_reason`)."""

from __future__ import annotations

import numpy as np

from fakes.groups import random_groups
from learner.packing import untrainable_reason


def _group(vocab_size: int = 500):
    return random_groups(
        np.random.default_rng(0), n_groups=1, group_size=2, version=0, vocab_size=vocab_size
    )[0]


def test_a_group_inside_the_budget_and_the_vocabulary_is_trainable():
    group = _group()
    longest = max(t.num_tokens for t in group.trajectories)
    assert untrainable_reason(group, micro_batch_tokens=longest, vocab_size=500) is None


def test_a_token_id_outside_the_vocabulary_is_named():
    group = _group()
    group.trajectories[1].response_ids[3] = 500
    reason = untrainable_reason(group, micro_batch_tokens=10**6, vocab_size=500)
    assert reason is not None and "response_ids[3] = 500" in reason and "trajectory 1" in reason
    assert untrainable_reason(group, micro_batch_tokens=10**6) is None  # no vocabulary given: not checked


def test_a_trajectory_over_the_token_budget_is_named():
    group = _group()
    longest = max(t.num_tokens for t in group.trajectories)
    reason = untrainable_reason(group, micro_batch_tokens=longest - 1, vocab_size=500)
    assert reason is not None and "learner.micro_batch_tokens" in reason
