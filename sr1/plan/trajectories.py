"""The trajectories a simulated step generates: their groups, turns and lengths, drawn from the profile's workload.

    turns = draw_turns(rng, pipe, profile)   # sampled tokens of each turn; a search follows every turn but the last

Searches per trajectory are binomial over `max_turns` with the profile's mean; tokens per turn lognormal with the
profile's mean and spread, capped by `max_tokens_per_turn`, the whole response by `max_response_tokens` (a turn
and, but for the last, its observation count against it). Used by the pipeline's simulation (`simulate.py`) and by
the Search-R1 baseline (`search_r1.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from sr1.plan.pipeline import Pipeline
from sr1.plan.profile import Profile


@dataclass
class Group:
    group_id: str
    release_version: int
    left: int  # trajectories not finished
    engine: int = -1
    trajectory_tokens: list[int] = field(default_factory=list)  # prompt + response tokens of each trajectory
    tokens_by_version: dict[int, int] = field(
        default_factory=dict
    )  # sampled tokens by the version that sampled them


@dataclass
class Trajectory:
    group: Group
    turns: list[int]  # sampled tokens of each turn; a search follows every turn but the last
    obs_tokens: int
    turn: int = 0
    search_started: float = 0.0  # when its current search reached the retrieval server
    search_latency: float = 0.0  # that search's round trip drawn for an unloaded server


@dataclass
class Turn:
    trajectory: Trajectory
    decode: int
    prefill_work: float
    start_v: float = 0.0
    attributed: int = 0  # sampled tokens already credited to a version


def lognormal(rng: np.random.Generator, mean: float, cv: float) -> float:
    """One draw of a lognormal with this mean and coefficient of variation (the mean itself when cv is 0)."""
    if cv <= 0 or mean <= 0:
        return mean
    sigma2 = math.log1p(cv * cv)
    return float(rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2)))


def draw_turns(rng: np.random.Generator, pipe: Pipeline, profile: Profile) -> list[int]:
    """Sampled tokens of each turn of one trajectory."""
    w = profile.workload
    searches = 0
    if w.searches_per_trajectory.value > 0:
        p = min(w.searches_per_trajectory.value / pipe.max_turns, 1.0)
        searches = int(rng.binomial(pipe.max_turns, p))
    turns, budget = [], pipe.max_response_tokens
    for i in range(searches + 1):
        tokens = round(lognormal(rng, w.tokens_per_turn.value, w.tokens_per_turn_cv.value))
        tokens = max(1, min(tokens, pipe.max_tokens_per_turn, budget))
        turns.append(tokens)
        budget -= tokens + (obs_tokens(pipe, profile) if i < searches else 0)
        if budget <= 0:
            break  # the token budget ends the trajectory
    return turns


def obs_tokens(pipe: Pipeline, profile: Profile) -> int:
    """Observation tokens one search appends (the profile's mean, cut at `max_obs_tokens`)."""
    return round(min(profile.workload.obs_tokens_per_search.value, pipe.max_obs_tokens))
