"""Search-R1 as it runs: veRL's synchronous multi-turn loop, colocated on every GPU, step by step; the baseline
`sr1 plan` compares every split with ("vs Search-R1 as it runs").

    result = search_r1_step(pipe, profile, kind, gpus=8, reference=True, critic=False)
    result.step_s, result.phases             # seconds per step, and where they go
    fit_trainer_mfu(pipe, profile, kind, gpus=8, target_s=133.0, reference=True, critic=False)

What one step does, as read from Search-R1's repository (`search_r1/llm_agent/generation.py` `run_llm_loop`,
`verl/trainer/ppo/ray_trainer.py` `fit`, `verl/workers/fsdp_workers.py` and `vllm_rollout.py`, and its
`verl/trainer/config/ppo_trainer.yaml`):

- Per turn (at most `max_turns`, plus a last one for the trajectories that searched every time) one
  `generate_sequences` over every trajectory still active, dealt evenly over the engines (one per `tensor_parallel`
  GPUs). The call ends with its slowest engine; in an engine the batch shares its tokens/s as in `simulate.py`, but
  a decode step never takes less than `decode_step_floor_s` (the engine runs with `enforce_eager: True`). Each call
  prefills every active context again (`free_cache_engine: True` drops the KV cache between calls), samples past a
  turn's `</search>` (its sampling has no stop strings: `run_on_tokens` more, up to the per-turn cap, cut off
  afterwards), recomputes the log-probs of what it generated (`generate_sequences` does unless the batch's meta info
  says not to, and the loop's batches carry none), and costs `generate_call_s` besides (the actor's offloaded
  parameters loaded and copied into vLLM, the cache built and freed).
- Then the turn's searches, every query of the turn in one request (`retrieval_queries_per_s`).
- After the last turn: the actor's log-prob recompute, the reference's forward (KL), for PPO the critic's values;
  the update (and the critic's). Each pass is FLOPs (2 x parameters per token forward, 6 x for forward and
  backward) at `trainer_mfu` of the GPUs' dense peak, the batch balanced over every GPU; `step_overhead_s` besides.

Every trajectory's turns, searches and lengths are drawn as `simulate.py` draws them (`trajectories.py`); each
simulated step is independent (a synchronous step starts from nothing), and the result is their mean.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sr1.plan.pipeline import Pipeline
from sr1.plan.profile import GpuKind, Profile, ProfileError, with_figures
from sr1.plan.trajectories import draw_turns, lognormal, obs_tokens

PHASES = (
    "generation",
    "generate calls",
    "per-turn log-probs",
    "searches",
    "old log-probs",
    "reference",
    "critic",
    "update",
    "overhead",
)


@dataclass
class SearchR1Result:
    """Seconds per step of Search-R1's loop and where they go (means over the simulated steps)."""

    step_s: float
    phases: dict[str, float] = field(default_factory=dict)
    generate_calls: float = 0.0  # per step
    model_tokens: float = 0.0  # per step, prompt + response

    @property
    def steps_per_hour(self) -> float:
        return 3600.0 / self.step_s


def batch_seconds(works: list[float], capacity: Callable[[int], float], slots: int) -> float:
    """Seconds until the last of `works` (each in units of one sequence's decoded tokens) finishes in one engine:
    processor sharing of `capacity(k)` among the k in service, at most `slots` of them, the rest in order."""
    waiting, heap, v, t = deque(works), [], 0.0, 0.0
    while waiting and len(heap) < slots:
        heapq.heappush(heap, waiting.popleft())
    while heap:
        n = len(heap)
        finish = heap[0]
        t += (finish - v) * n / capacity(n)
        v = finish
        heapq.heappop(heap)
        if waiting:
            heapq.heappush(heap, v + waiting.popleft())
    return t


def _eager_capacity(profile: Profile) -> Callable[[int], float]:
    curve, floor = profile.generator.tokens_per_s, profile.search_r1.decode_step_floor_s.value
    if floor <= 0:
        return curve.at
    return lambda n: min(curve.at(n), n / floor)


def _one_step(
    rng: np.random.Generator,
    pipe: Pipeline,
    profile: Profile,
    flops_per_s: float,
    reference: bool,
    critic: bool,
) -> tuple[dict[str, float], int, float]:
    """(seconds by phase, generate calls, model tokens) of one simulated step."""
    sr, w = profile.search_r1, profile.workload
    params = profile.params_billion.value * 1e9
    capacity = _eager_capacity(profile)
    prefill = profile.generator.prefill_cost.value
    prompt, obs = round(w.prompt_tokens.value), obs_tokens(pipe, profile)
    trajectories = [draw_turns(rng, pipe, profile) for _ in range(pipe.groups_per_step * pipe.group_size)]
    phases = dict.fromkeys(PHASES, 0.0)
    calls = 0
    for k in range(pipe.max_turns + 1):
        active = [turns for turns in trajectories if len(turns) > k]
        if not active:
            break
        calls += 1
        works, forward_tokens = [], 0
        for turns in active:
            context = prompt + sum(turns[:k]) + obs * k
            sampled = turns[k]
            if len(turns) > k + 1:  # a searching turn runs on past its </search>
                run_on = lognormal(rng, sr.run_on_tokens.value, w.tokens_per_turn_cv.value)
                sampled = min(turns[k] + round(run_on), pipe.max_tokens_per_turn)
            works.append(prefill * context + sampled)
            forward_tokens += context + sampled
        share = math.ceil(len(works) / pipe.engines)  # veRL pads the batch to a multiple of the engines
        phases["generation"] += max(
            batch_seconds(works[i : i + share], capacity, pipe.max_num_seqs)
            for i in range(0, len(works), share)
        )
        phases["generate calls"] += sr.generate_call_s.value
        phases["per-turn log-probs"] += 2 * params * forward_tokens / flops_per_s
        queries = sum(1 for turns in active if len(turns) > k + 1)
        phases["searches"] += queries / sr.retrieval_queries_per_s.value
    tokens = sum(prompt + sum(turns) + obs * (len(turns) - 1) for turns in trajectories)
    forward, train = 2 * params * tokens / flops_per_s, 6 * params * tokens * pipe.ppo_epochs / flops_per_s
    phases["old log-probs"] = forward
    phases["reference"] = forward if reference else 0.0
    phases["critic"] = forward + train if critic else 0.0
    phases["update"] = train
    phases["overhead"] = sr.step_overhead_s.value
    return phases, calls, float(tokens)


def search_r1_step(
    pipe: Pipeline,
    profile: Profile,
    kind: GpuKind,
    *,
    gpus: int,
    reference: bool,
    critic: bool,
    steps: int = 12,
    seed: int = 0,
) -> SearchR1Result:
    """The mean step of Search-R1's loop running `pipe`'s step shape on `gpus` GPUs of `kind` (`pipe.engines`
    engines), over `steps` independent draws."""
    if profile.search_r1 is None:
        raise ProfileError(f"profile {profile.name!r} has no search_r1 figures")
    if kind.peak_tflops is None:
        raise ProfileError(f"the '{kind.description}' kind has no peak FLOP/s: Search-R1's loop runs on GPUs")
    flops_per_s = gpus * kind.peak_tflops * 1e12 * profile.search_r1.trainer_mfu.value
    rng = np.random.default_rng(seed)
    draws = [_one_step(rng, pipe, profile, flops_per_s, reference, critic) for _ in range(max(steps, 1))]
    phases = {name: float(np.mean([d[0][name] for d in draws])) for name in PHASES}
    return SearchR1Result(
        step_s=sum(phases.values()),
        phases=phases,
        generate_calls=float(np.mean([d[1] for d in draws])),
        model_tokens=float(np.mean([d[2] for d in draws])),
    )


def fit_trainer_mfu(
    pipe: Pipeline,
    profile: Profile,
    kind: GpuKind,
    *,
    gpus: int,
    target_s: float,
    reference: bool,
    critic: bool,
    steps: int = 12,
    seed: int = 0,
) -> Profile:
    """`profile` with `search_r1.trainer_mfu` set so that Search-R1's simulated step takes `target_s` seconds (the
    step falls as the MFU rises: a bisection over its logarithm), every other figure as it is."""
    if profile.search_r1 is None:
        raise ProfileError(f"profile {profile.name!r} has no search_r1 figures to fit")

    def step_at(mfu: float) -> float:
        trial = with_figures(profile, {"search_r1.trainer_mfu": mfu}, "fit")
        return search_r1_step(
            pipe, trial, kind, gpus=gpus, reference=reference, critic=critic, steps=steps, seed=seed
        ).step_s

    lo, hi = math.log(1e-3), math.log(1.0)
    if step_at(1.0) > target_s:
        raise ProfileError(
            f"Search-R1's step takes {step_at(1.0):.1f} s even at an MFU of 1, more than {target_s:g} s: the "
            "generation, search and per-call figures alone exceed it"
        )
    for _ in range(40):
        mid = (lo + hi) / 2
        if step_at(math.exp(mid)) > target_s:
            lo = mid
        else:
            hi = mid
    mfu = math.exp((lo + hi) / 2)
    source = (
        f"fitted: the MFU at which this planner's Search-R1 loop takes {target_s:g} s per step with the other "
        f"figures of {profile.name!r} ({pipe.groups_per_step} groups x {pipe.group_size} on {gpus} x "
        f"{kind.description}; sr1 plan --fit-search-r1 {target_s:g})"
    )
    return with_figures(profile, {"search_r1.trainer_mfu": round(mfu, 4)}, source)
