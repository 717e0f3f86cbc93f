"""The batches scripts/bench/bench_learner.py trains on (`--workload`).

    spec = SearchR1Spec.of(load_config("qwen2.5-3b-8xh100"), profile="qwen2.5-3b-h100")
    groups = search_r1_groups(rng, spec, trajectories=256, vocab=151_936)   # one PPO mini-batch
    groups = tiny_groups(rng, n_groups=8, group_size=8, max_len=1024, vocab=1024)
    batch_stats([groups, ...])          # trajectories, mean / max tokens, loss-token share, searches

- `search-r1`: Search-R1's step. Each trajectory's shape is drawn by the planner's own sampler
  (sr1/plan/trajectories.py) from the workload of a planner profile (`qwen2.5-3b-h100`: a 200-token prompt, turns
  lognormal around 120 sampled tokens, about two searches of 400 observation tokens), cut by the preset's generator
  budgets (`max_turns`, `max_tokens_per_turn`, `max_obs_tokens`, `max_response_tokens`), in groups of the preset's
  `group_size`. The response is laid out as the generators write it (buffer/records.py): turn, observation, turn, ...;
  observation tokens have loss_mask 0, version -1 and log-prob 0, so the policy forwards them but they carry no
  loss; a response that reaches `max_response_tokens` ends with finish reason `budget`, as the agent loop marks it
  (DAPO's overlong filtering then masks it where the preset says so). Sampled tokens' behaviour log-probs sit near
  a uniform policy's over the vocabulary (what a random-init model gives), so importance ratios are near 1 as in a
  real step. Rewards alternate 1/0 within each group (every group carries a GRPO gradient).
- `tiny`: the toy mix of the figures before the Search-R1 workload existed: prompts of 32-127 tokens, lognormal
  responses (median about 150 tokens, at most `max_len` in all), three masked tokens in each response.

Token ids are random: throughput and memory do not depend on them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from buffer.records import Group, Trajectory
from learner.algorithms.shaping import TRUNCATED

WORKLOADS = ("search-r1", "tiny")
DEFAULT_PROFILE = "qwen2.5-3b-h100"  # the planner profile of the 8xH100 recipe: its workload is Search-R1's


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
    def tokens(self) -> int:
        return self.prompt + sum(self.turns) + self.searches * self.obs_tokens


@dataclass(frozen=True)
class SearchR1Spec:
    """What the search-r1 workload draws from: a planner profile (its workload) and a preset's budgets and group size
    (`limits`, the planner's Pipeline of the config)."""

    profile: object  # sr1.plan.profile.Profile
    limits: object  # sr1.plan.pipeline.Pipeline: max_turns, max_tokens_per_turn, max_obs_tokens, max_response_tokens
    profile_name: str
    length_scale: float = 1.0

    @property
    def workload(self):
        return self.profile.workload

    @property
    def group_size(self) -> int:
        return self.limits.group_size

    @classmethod
    def of(cls, config, profile: str = DEFAULT_PROFILE, length_scale: float = 1.0) -> SearchR1Spec:
        """From a loaded config and a planner profile (name or file). `length_scale` multiplies every length (prompt,
        turn, observation, the budgets): below 1 for small runs on a CPU."""
        from sr1.plan.profile import load_profile
        from sr1.plan.splits import pipeline

        if not length_scale > 0:
            raise ValueError(f"--length-scale must be > 0, got {length_scale}")
        loaded = load_profile(profile)
        limits = pipeline(config, engines=1, ranks=1, max_staleness=0)
        if length_scale != 1.0:
            loaded, limits = _scaled(loaded, limits, length_scale)
        return cls(loaded, limits, str(profile), length_scale)

    def draw(self, rng: np.random.Generator) -> TrajectoryShape:
        """One trajectory's shape, by the planner's own sampler (sr1/plan/trajectories.py)."""
        from sr1.plan.trajectories import draw_turns, obs_tokens

        turns = draw_turns(rng, self.limits, self.profile)
        return TrajectoryShape(
            round(self.workload.prompt_tokens.value), tuple(turns), obs_tokens(self.limits, self.profile)
        )

    def describe(self) -> str:
        w, lim = self.workload, self.limits
        scale = f", lengths x {self.length_scale:g}" if self.length_scale != 1.0 else ""
        return (
            f"search-r1 (profile {self.profile_name}: prompt {w.prompt_tokens.value:g} tokens, turns of "
            f"~{w.tokens_per_turn.value:g} sampled tokens (cv {w.tokens_per_turn_cv.value:g}, <= "
            f"{lim.max_tokens_per_turn}), {w.searches_per_trajectory.value:g} searches (<= {lim.max_turns}) of "
            f"{w.obs_tokens_per_search.value:g} observation tokens (<= {lim.max_obs_tokens}), response <= "
            f"{lim.max_response_tokens}; groups of {self.group_size}{scale})"
        )


def _scaled(profile, limits, factor: float):
    """The profile (its workload) and budgets with every length multiplied by `factor` (at least one token each)."""
    import dataclasses

    from sr1.plan.profile import Figure

    def figure(current):
        return Figure(value=max(1.0, current.value * factor), source=f"{current.source} (x {factor:g})")

    workload = profile.workload.model_copy(
        update={
            name: figure(getattr(profile.workload, name))
            for name in ("prompt_tokens", "tokens_per_turn", "obs_tokens_per_search")
        }
    )
    limits = dataclasses.replace(
        limits,
        max_tokens_per_turn=max(1, round(limits.max_tokens_per_turn * factor)),
        max_obs_tokens=max(1, round(limits.max_obs_tokens * factor)),
        max_response_tokens=max(1, round(limits.max_response_tokens * factor)),
    )
    return profile.model_copy(update={"workload": workload}), limits


def search_trajectory(rng: np.random.Generator, shape, vocab: int, reward: float, limits) -> Trajectory:
    """A trajectory of `shape`: turns and observations laid out in order."""
    mask_parts = []
    for i, turn in enumerate(shape.turns):
        mask_parts.append(np.ones(turn, dtype=np.uint8))
        if i < shape.searches:
            mask_parts.append(np.zeros(shape.obs_tokens, dtype=np.uint8))
    mask = np.concatenate(mask_parts)
    n = len(mask)
    sampled = mask == 1
    behaviour = -math.log(vocab) + 0.1 * rng.standard_normal(n)
    return Trajectory(
        prompt_ids=rng.integers(0, vocab, shape.prompt),
        response_ids=rng.integers(0, vocab, n),
        loss_mask=mask,
        behavior_logprobs=np.where(sampled, behaviour, 0.0),
        versions=np.where(sampled, 0, -1),
        reward=reward,
        info={
            "tool_calls": shape.searches,
            "finish_reason": TRUNCATED if n >= limits.max_response_tokens else "answer",
        },
    )


def search_r1_groups(
    rng: np.random.Generator, spec: SearchR1Spec, trajectories: int, vocab: int, name: str = "bench"
) -> list[Group]:
    """`trajectories` trajectories in groups of `spec.group_size` (the last group holds what is left, as a
    mini-batch of 256 cuts Search-R1's groups of 5)."""
    if trajectories < 1:
        raise ValueError(f"trajectories must be >= 1, got {trajectories}")
    groups = []
    for g, start in enumerate(range(0, trajectories, spec.group_size)):
        size = min(spec.group_size, trajectories - start)
        members = [
            search_trajectory(rng, spec.draw(rng), vocab, float(i % 2), spec.limits) for i in range(size)
        ]
        groups.append(Group(f"{name}/train/{g}/e0", name, g, members))
    return groups


def tiny_lengths(rng: np.random.Generator, n: int, max_len: int) -> list[tuple[int, int]]:
    """(prompt, response) lengths of the toy mix: short prompts, heavy-tailed responses."""
    out = []
    for _ in range(n):
        prompt = int(rng.integers(32, 128))
        response = int(min(max_len - prompt, max(16, rng.lognormal(5.0, 0.8))))
        out.append((prompt, response))
    return out


def tiny_groups(
    rng: np.random.Generator, n_groups: int, group_size: int, max_len: int, vocab: int
) -> list[Group]:
    """The toy mix, `n_groups` groups of `group_size`."""
    from fakes.groups import random_trajectory

    groups = []
    for g in range(n_groups):
        members = [
            random_trajectory(
                rng, prompt_len=p, response_len=r, version=0, vocab_size=vocab, reward=float(i % 2)
            )
            for i, (p, r) in enumerate(tiny_lengths(rng, group_size, max_len))
        ]
        groups.append(Group(f"bench/train/{g}/e0", "bench", g, members))
    return groups


def batch_tokens(groups: list[Group]) -> int:
    """Tokens through the policy: every trajectory's prompt and response (sampled and observation tokens)."""
    return sum(t.num_tokens for g in groups for t in g.trajectories)


def batch_stats(batches: list[list[Group]]) -> dict:
    """Trajectory shape statistics over the given batches."""
    trajectories = [t for groups in batches for g in groups for t in g.trajectories]
    lengths = np.array([t.num_tokens for t in trajectories])
    loss = sum(t.num_loss_tokens for t in trajectories)
    return {
        "trajectories": len(trajectories),
        "mean_seq_len": float(lengths.mean()),
        "max_seq_len": int(lengths.max()),
        "loss_token_fraction": loss / int(lengths.sum()),
        "searches_per_trajectory": float(np.mean([t.info.get("tool_calls", 0) for t in trajectories])),
    }
