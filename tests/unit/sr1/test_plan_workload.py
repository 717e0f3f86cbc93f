"""sr1/plan/workload.py: the one sampler of trajectory shapes (the planner's simulation and the learner benchmark)."""

from __future__ import annotations

import numpy as np
import pytest

from sr1.plan.profile import load_profile
from sr1.plan.workload import TrajectoryLimits, draw_trajectory

SEARCH_R1 = TrajectoryLimits(
    max_turns=4, max_tokens_per_turn=500, max_obs_tokens=500, max_response_tokens=4096
)


def test_search_r1_trajectories_have_the_profiles_shape_on_average():
    """The 8xH100 profile's workload: a 200-token prompt, 1 + Binomial(4, 1/2) turns of ~120 sampled tokens, a
    400-token observation after every turn but the last: about 200 + 3 x 120 + 2 x 400 = 1,360 tokens."""
    workload = load_profile("qwen2.5-3b-h100").workload
    rng = np.random.default_rng(0)
    shapes = [draw_trajectory(rng, workload, SEARCH_R1) for _ in range(4000)]
    assert all(s.prompt == 200 and s.obs_tokens == 400 for s in shapes)
    assert np.mean([s.searches for s in shapes]) == pytest.approx(2.0, abs=0.1)
    assert np.mean([len(s.turns) for s in shapes]) == pytest.approx(3.0, abs=0.1)
    assert np.mean([t for s in shapes for t in s.turns]) == pytest.approx(120, rel=0.05)
    assert np.mean([s.tokens for s in shapes]) == pytest.approx(1360, rel=0.05)
    assert max(s.response_tokens for s in shapes) <= 4096 and max(t for s in shapes for t in s.turns) <= 500


@pytest.mark.parametrize(
    "limits",
    [
        TrajectoryLimits(max_turns=4, max_tokens_per_turn=500, max_obs_tokens=300, max_response_tokens=700),
        TrajectoryLimits(max_turns=8, max_tokens_per_turn=64, max_obs_tokens=500, max_response_tokens=900),
        TrajectoryLimits(max_turns=1, max_tokens_per_turn=10, max_obs_tokens=5, max_response_tokens=12),
    ],
)
def test_the_budgets_cut_every_turn_observation_and_response(limits):
    workload = load_profile("qwen2.5-3b-h100").workload
    rng = np.random.default_rng(1)
    for _ in range(500):
        shape = draw_trajectory(rng, workload, limits)
        assert shape.searches <= limits.max_turns and shape.obs_tokens <= limits.max_obs_tokens
        assert all(1 <= t <= limits.max_tokens_per_turn for t in shape.turns)
        assert shape.response_tokens <= limits.max_response_tokens
        assert shape.tokens == shape.prompt + sum(shape.turns) + shape.searches * shape.obs_tokens
