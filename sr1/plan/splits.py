"""Every way to split N GPUs between the generator pool and the learner pool, each at a range of staleness bounds,
simulated; and the recommendation.

    plan = make_plan(cfg, profile, gpus=8, kind="h100", bounds=[0, 1, 2, 4])
    plan.recommended   # the fastest split and bound (the smaller bound among near-ties)

A split gives `g` GPUs to engines (`g / tensor_parallel_size` engines) and the other `N - g` to learner ranks (any
number: trajectories are dealt to the ranks by tokens). A split is excluded, with its reason, when a pool's memory
would not hold the model. The shared layout puts an engine and a learner rank on every GPU, at the engines'
`gpu_memory_utilization` and the rest for the learner (`lora.shared_gpu_refusal` says when it cannot run). With
`learner.lora` the learner's figures are derived from the full-weight profile (`lora.py`). Two baselines: the colocated synchronous layout (sr1's own engines and learner on every
GPU, generating then training, on-policy), and Search-R1 as it runs (veRL's synchronous multi-turn loop,
`search_r1.py`), when the profile has its figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from learner.execution.memory import COMPUTE_BYTES
from sr1.plan.lora import adapter_summary, lora_profile, shared_gpu_refusal
from sr1.plan.profile import (
    Profile,
    ProfileError,
    check_memory,
    engine_memory_gib,
    gpu_kind,
    learner_memory_gib,
)
from sr1.plan.search_r1 import SearchR1Result, fit_trainer_mfu, search_r1_step
from sr1.plan.simulate import Pipeline, SimResult, simulate

# Rows within this share of the best steps/hour count as ties; the smaller bound (fresher data) is recommended.
TIE = 0.02


@dataclass
class PlanRow:
    """One split at one bound: its simulated result, or why it was excluded."""

    generator_gpus: int
    learner_gpus: int
    max_staleness: int
    result: SimResult | None = None
    excluded: str | None = None
    speedup_vs_sync_split: float | None = None  # over the same split at max_staleness 0
    speedup_vs_colocated: float | None = None  # over the colocated synchronous layout on all GPUs
    speedup_vs_search_r1: float | None = None  # over Search-R1's own loop on all GPUs
    shared: bool = False  # an engine and a learner rank on each of the GPUs

    @property
    def label(self) -> str:
        if self.shared:
            return f"{self.generator_gpus} shared (engine + rank each)"
        return f"{self.generator_gpus} gen / {self.learner_gpus} learn"


@dataclass
class Plan:
    """The sweep's rows, the colocated synchronous baseline and the recommendation."""

    gpus: int
    gpu_kind: str
    profile: Profile
    preset: str
    rows: list[PlanRow] = field(default_factory=list)
    colocated: SimResult | None = None
    colocated_excluded: str | None = None
    search_r1: SearchR1Result | None = None
    search_r1_excluded: str | None = None
    recommended: PlanRow | None = None
    shared_profile: Profile | None = None  # the figures of the shared layout's learner (its memory share)
    full_profile: Profile | None = None  # the full-weight figures a LoRA profile was derived from
    shared_excluded: str | None = None  # why the shared layout cannot run (None: planned, or not asked for)
    lora: dict | None = None  # the adapter's size beside the full weights (lora.adapter_summary)


def pipeline(cfg, *, engines: int, ranks: int, max_staleness: int) -> Pipeline:
    """The pipeline a root config describes, with another split and bound."""
    gen, learner = cfg.generators, cfg.learner
    return Pipeline(
        engines=engines,
        ranks=ranks,
        groups_per_step=learner.groups_per_step,
        group_size=gen.group_size,
        max_staleness=max_staleness,
        max_turns=gen.max_turns,
        max_tokens_per_turn=gen.max_tokens_per_turn,
        max_obs_tokens=gen.max_obs_tokens,
        max_response_tokens=gen.max_response_tokens,
        max_inflight_groups=gen.max_inflight_groups,
        claim_batch_groups=gen.claim_batch_groups,
        max_num_seqs=gen.engine.max_num_seqs,
        ppo_epochs=learner.ppo_epochs,
        ppo_mini_batch_size=learner.ppo_mini_batch_size,
        checkpoint_every=learner.checkpoint_every,
        dynamic_sampling=learner.algorithm.dynamic_sampling,
    )


def _lora(cfg, profile: Profile, hardware, bounds: list[int], learner_share: float = 1.0) -> Profile:
    """The profile a LoRA learner of `cfg` plans with (`lora.lora_profile`), or `profile` without learner.lora."""
    lora, learner = getattr(cfg.learner, "lora", None), cfg.learner
    if lora is None and profile.lora is not None:
        raise ProfileError(
            f"profile {profile.name!r} holds a LoRA learner's figures ({profile.lora}) and the config trains every "
            "weight: give a full-weight profile"
        )
    if lora is None or profile.lora is not None:  # full weights, or a LoRA run's own measurements
        return profile
    engine_lora = getattr(cfg.generators, "lora", None)
    max_loras = getattr(engine_lora, "max_loras", None) or max(bounds) + 2
    return lora_profile(
        profile,
        lora,
        tokens=learner.micro_batch_tokens,
        chunk_tokens=learner.logprob_chunk_tokens,
        policy=learner.gradient_checkpointing,
        kind=hardware,
        max_loras=max_loras,
        learner_share=learner_share,
        wire_bytes=COMPUTE_BYTES[cfg.model.dtype],  # the engines' dtype, the one the publish sends
    )


def _memory_flags(cfg) -> dict[str, bool]:
    """The models beside the policy that the learner of `cfg` keeps: the facts its algorithm owns."""
    algorithm = cfg.learner.algorithm
    return {"reference": algorithm.needs_reference, "critic": algorithm.needs_critic}


def fit_search_r1(
    cfg, profile: Profile, *, gpus: int, kind: str, target_s: float, steps: int, seed: int
) -> Profile:
    """`profile` with Search-R1's trainer MFU fitted so that its loop runs `cfg`'s step in `target_s` seconds on
    `gpus` GPUs of `kind` (`search_r1.fit_trainer_mfu`)."""
    tp = cfg.generators.engine.tensor_parallel_size
    pipe = pipeline(cfg, engines=gpus // tp, ranks=gpus, max_staleness=0)
    return fit_trainer_mfu(
        pipe,
        profile,
        gpu_kind(kind),
        gpus=gpus,
        target_s=target_s,
        steps=steps,
        seed=seed,
        **_memory_flags(cfg),
    )


def make_plan(
    cfg,
    profile: Profile,
    *,
    gpus: int,
    kind: str,
    bounds: list[int],
    steps: int = 12,
    warmup: int = 2,
    seed: int = 0,
    preset: str = "",
) -> Plan:
    """Simulate every split of `gpus` devices of `kind` at every bound in `bounds` (0 is always included)."""
    hardware = gpu_kind(kind)
    if gpus < 1:
        raise ValueError(f"--gpus must be at least 1, got {gpus}")
    if any(b < 0 for b in bounds):
        raise ValueError(f"bounds must be >= 0, got {bounds}")
    bounds = sorted(set(bounds) | {0})
    tp = cfg.generators.engine.tensor_parallel_size
    utilization = cfg.generators.engine.gpu_memory_utilization
    flags = _memory_flags(cfg)
    full = profile
    profile = _lora(cfg, full, hardware, bounds)
    plan = Plan(gpus=gpus, gpu_kind=kind, profile=profile, preset=preset, full_profile=full)
    if profile.lora is not None and profile.shape is not None:
        plan.lora = adapter_summary(full, cfg.learner.lora, COMPUTE_BYTES[cfg.model.dtype])
    for generator_gpus in range(tp, gpus, tp):
        ranks = gpus - generator_gpus
        why = check_memory(
            profile, hardware, ranks=ranks, tensor_parallel=tp, gpu_memory_utilization=utilization, **flags
        )
        sync_result = None
        for bound in bounds:
            row = PlanRow(generator_gpus, ranks, bound, excluded=why)
            if why is None:
                pipe = pipeline(cfg, engines=generator_gpus // tp, ranks=ranks, max_staleness=bound)
                row.result = simulate(pipe, profile, steps=steps, warmup=warmup, seed=seed)
                sync_result = sync_result or row.result
                row.speedup_vs_sync_split = row.result.steps_per_hour / sync_result.steps_per_hour
            plan.rows.append(row)
    _shared(plan, cfg, hardware, bounds, flags, steps, warmup, seed)
    _colocated(plan, cfg, hardware, tp, flags, steps, warmup, seed)
    _search_r1(plan, cfg, hardware, tp, flags, steps, seed)
    _recommend(plan)
    return plan


def _shared(
    plan: Plan, cfg, hardware, bounds: list[int], flags: dict, steps: int, warmup: int, seed: int
) -> None:
    """An engine and a learner rank on every GPU, asynchronous, each at its memory share; each slows the other
    while both have work (`shared_gpu_speed`). Excluded, with the reason, when it cannot run."""
    gpus, share = plan.gpus, cfg.generators.engine.gpu_memory_utilization
    profile = _lora(cfg, plan.full_profile, hardware, bounds, learner_share=1 - share)
    learner_gib = learner_memory_gib(profile, gpus, **flags)
    why = shared_gpu_refusal(cfg, profile, hardware, learner_gib, engine_memory_gib(profile, 1))
    plan.shared_profile = profile
    if why is not None:
        plan.shared_excluded = why
        return
    sync_result = None
    for bound in bounds:
        pipe = replace(pipeline(cfg, engines=gpus, ranks=gpus, max_staleness=bound), shared_gpu=True)
        row = PlanRow(gpus, gpus, bound, shared=True)
        row.result = simulate(pipe, profile, steps=steps, warmup=warmup, seed=seed)
        sync_result = sync_result or row.result
        row.speedup_vs_sync_split = row.result.steps_per_hour / sync_result.steps_per_hour
        plan.rows.append(row)


def _colocated(plan: Plan, cfg, hardware, tp: int, flags: dict, steps: int, warmup: int, seed: int) -> None:
    """The colocated synchronous layout, with sr1's engines and learner: all GPUs generate, then all train; both
    models must fit on every GPU."""
    profile, gpus = plan.profile, plan.gpus
    if hardware.memory_gib is not None and plan.lora is not None:  # the LoRA learner plans around the engine
        room = 1 - engine_memory_gib(profile, tp) / hardware.memory_gib
        profile = _lora(cfg, plan.full_profile, hardware, [0], learner_share=max(room, 0.01))
    if hardware.memory_gib is not None:
        need = learner_memory_gib(profile, gpus, **flags) + engine_memory_gib(profile, tp)
        if need > hardware.memory_gib:
            plan.colocated_excluded = f"learner and engine together need {need:.1f} GiB per GPU, more than {hardware.memory_gib:.0f} GiB"
    if plan.colocated_excluded is None:
        # veRL deals the batch evenly over its rollout workers: one group per read, round the engines
        pipe = replace(pipeline(cfg, engines=gpus // tp, ranks=gpus, max_staleness=0), claim_batch_groups=1)
        plan.colocated = simulate(pipe, profile, steps=steps, warmup=warmup, seed=seed)
        for row in plan.rows:
            if row.result is not None:
                row.speedup_vs_colocated = row.result.steps_per_hour / plan.colocated.steps_per_hour


def _search_r1(plan: Plan, cfg, hardware, tp: int, flags: dict, steps: int, seed: int) -> None:
    """Search-R1's own loop on every GPU (its actor, reference and critic offloaded to CPU, so memory is not
    checked); left out, with the reason, when the profile has no figures for it or the kind no peak FLOP/s."""
    if plan.profile.search_r1 is None:
        plan.search_r1_excluded = "the profile has no search_r1 figures"
        return
    if hardware.peak_tflops is None:
        plan.search_r1_excluded = f"no peak FLOP/s for {plan.gpu_kind}"
        return
    pipe = pipeline(cfg, engines=plan.gpus // tp, ranks=plan.gpus, max_staleness=0)
    plan.search_r1 = search_r1_step(  # veRL's loop trains every weight: the full-weight figures
        pipe, plan.full_profile or plan.profile, hardware, gpus=plan.gpus, steps=steps, seed=seed, **flags
    )
    for row in plan.rows:
        if row.result is not None:
            row.speedup_vs_search_r1 = row.result.steps_per_hour / plan.search_r1.steps_per_hour


def _recommend(plan: Plan) -> None:
    ran = [r for r in plan.rows if r.result is not None]
    if not ran:
        return
    best = max(r.result.steps_per_hour for r in ran)
    near = [r for r in ran if r.result.steps_per_hour >= (1 - TIE) * best]
    plan.recommended = min(near, key=lambda r: (r.max_staleness, -r.result.steps_per_hour))
