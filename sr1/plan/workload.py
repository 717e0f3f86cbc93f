"""The shape of one search trajectory, drawn from a profile's workload: the one sampler of trajectory lengths, used by
the planner's simulation (`simulate.py`) and by the learner benchmark (`scripts/bench_learner.py --workload
search-r1`), so both describe the same step.

    limits = TrajectoryLimits(max_turns=4, max_tokens_per_turn=500, max_obs_tokens=500, max_response_tokens=4096)
    shape = draw_trajectory(rng, load_profile("qwen2.5-3b-h100").workload, limits)
    shape.prompt, shape.turns, shape.obs_tokens, shape.searches, shape.response_tokens

A trajectory is a prompt of `prompt_tokens`, then turns the model samples, a search after every turn but the last
appending `obs_tokens_per_search` observation tokens (cut at `max_obs_tokens`). The number of searches is binomial
over `max_turns` with the workload's mean; tokens per turn are lognormal with the workload's mean and coefficient of
variation, each cut at `max_tokens_per_turn`; the whole response (sampled and observation tokens) stays within
`max_response_tokens`: a turn is cut to what is left of it, and the trajectory ends when nothing is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sr1.plan.profile import WorkloadProfile


@dataclass(frozen=True)
class TrajectoryLimits:
    """The generators' budgets that bound a trajectory (`generators.*` of a config)."""

    max_turns: int = 4
    max_tokens_per_turn: int = 500
    max_obs_tokens: int = 500
    max_response_tokens: int = 4096

    @classmethod
    def of(cls, generators) -> TrajectoryLimits:
        """From a config's `generators` section (or anything with the same four fields)."""
        return cls(
            max_turns=generators.max_turns,
            max_tokens_per_turn=generators.max_tokens_per_turn,
            max_obs_tokens=generators.max_obs_tokens,
            max_response_tokens=generators.max_response_tokens,
        )


@dataclass(frozen=True)
class TrajectoryShape:
    """One drawn trajectory: prompt tokens, sampled tokens per turn, observation tokens per search."""

    prompt: int
    turns: tuple[int, ...]  # a search follows every turn but the last
    obs_tokens: int

    @property
    def searches(self) -> int:
        return len(self.turns) - 1

    @property
    def sampled_tokens(self) -> int:
        return sum(self.turns)

    @property
    def response_tokens(self) -> int:
        """Sampled and observation tokens: everything after the prompt."""
        return self.sampled_tokens + self.searches * self.obs_tokens

    @property
    def tokens(self) -> int:
        return self.prompt + self.response_tokens


def lognormal(rng: np.random.Generator, mean: float, cv: float) -> float:
    """A lognormal draw with this mean and coefficient of variation (the mean itself when either is <= 0)."""
    if cv <= 0 or mean <= 0:
        return mean
    sigma2 = math.log1p(cv * cv)
    return float(rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2)))


def observation_tokens(workload: WorkloadProfile, limits: TrajectoryLimits) -> int:
    """Tokens one search appends: the workload's mean, cut at `max_obs_tokens`."""
    return round(min(workload.obs_tokens_per_search.value, limits.max_obs_tokens))


def draw_turns(rng: np.random.Generator, workload: WorkloadProfile, limits: TrajectoryLimits) -> list[int]:
    """Sampled tokens of each turn of one trajectory (see the module docstring)."""
    searches = 0
    if workload.searches_per_trajectory.value > 0:
        p = min(workload.searches_per_trajectory.value / limits.max_turns, 1.0)
        searches = int(rng.binomial(limits.max_turns, p))
    obs = observation_tokens(workload, limits)
    turns, budget = [], limits.max_response_tokens
    for i in range(searches + 1):
        tokens = round(lognormal(rng, workload.tokens_per_turn.value, workload.tokens_per_turn_cv.value))
        tokens = max(1, min(tokens, limits.max_tokens_per_turn, budget))
        turns.append(tokens)
        budget -= tokens + (obs if i < searches else 0)
        if budget <= 0:
            break  # the token budget ends the trajectory
    return turns


def draw_trajectory(
    rng: np.random.Generator, workload: WorkloadProfile, limits: TrajectoryLimits
) -> TrajectoryShape:
    """One trajectory's prompt, turns and observation lengths."""
    turns = draw_turns(rng, workload, limits)
    return TrajectoryShape(
        prompt=round(workload.prompt_tokens.value),
        turns=tuple(turns),
        obs_tokens=observation_tokens(workload, limits),
    )
