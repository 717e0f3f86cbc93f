"""What one run of scripts/bench/bench_learner.py measures: its options, the learner's settings (a preset's, with the
options over them) and the steps it trains (warm-up, timed, profiled).

    args = parse(["--device", "cuda", "--shape", "qwen2.5-3b"])
    settings = learner_settings(args, model_dir, world)    # LearnerConfig, how it runs here, passes per token
    plan = step_plan(args, settings, vocab)                               # groups of each step
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field, replace

import scripts.bench.learner_workloads as workloads
from learner.execution.attention import IMPLEMENTATIONS
from learner.execution.memory import POLICIES
from scripts.bench.learner_baselines import CHECKPOINTED_SHAPES, PLAIN_CHECKPOINTING, SHAPES

H100_BF16_FLOPS = 989e12
DOES_NOT_FIT = (
    3  # exit status: the checkpointing asked for cannot fit this device at one rank (nothing was measured)
)
DEFAULT_PRESET = (
    "qwen2.5-3b-8xh100"  # sr1's 8xH100 recipe: Search-R1's GRPO with its KL loss and 256 per update
)


@dataclass
class Settings:
    """The learner's settings for this run and what its step computes per token."""

    cfg: object  # learner.settings.LearnerConfig, its `auto` checkpointing resolved
    dtype: str
    execution: object  # learner.execution.plan.Execution: how the learner runs here (what Learner plans)
    checkpointing_why: str | None
    updates: int  # PPO mini-batches (optimizer updates) per timed step, per epoch
    reference: bool  # the frozen reference forwards every token (KL)
    policy_pass: bool  # the policy forwards every token without gradient before the updates (proximal)
    kl_coef: float
    temperature: float = 1.0
    max_response_tokens: int | None = None
    spec: workloads.SearchR1Spec | None = None

    @property
    def checkpointing(self) -> str:
        return self.execution.checkpointing

    @property
    def checkpointing_every(self) -> int:
        return self.execution.checkpointing_every

    @property
    def no_grad_passes(self) -> float:
        """No-gradient forwards per trained token: the reference's and the proximal pass run once per step, the
        training pass once per PPO epoch."""
        return (int(self.reference) + int(self.policy_pass)) / self.cfg.ppo_epochs


@dataclass
class Plan:
    """The groups each step trains on: warm-up (untimed, at `warmup_mini_batch` trajectories per update), timed,
    and the profiled step."""

    warmup: list = field(default_factory=list)
    warmup_mini_batch: int | None = None
    timed: list = field(default_factory=list)
    profile: list = field(default_factory=list)
    describe: str = ""


def _preset(args):
    if args.preset is None:
        return None
    from config.loader import load_config

    return load_config(args.preset)


def learner_settings(args, model_dir: str, world) -> Settings:
    """The preset's learner settings (or LearnerConfig's defaults), one rank, with the options over them, and how the
    learner runs them on this device (learner/execution/plan.py: the same plan `Learner` makes; its `auto`
    checkpointing is resolved here so that the plain step checkpoints alike)."""
    from pydantic import ValidationError

    from learner.settings import LearnerConfig

    config = _preset(args)
    cuda = args.device == "cuda"
    dtype = args.dtype or (
        config.model.dtype if config is not None and cuda else "bfloat16" if cuda else "float32"
    )
    base = config.learner.model_dump() if config is not None else {"lr": 1e-5}
    search = args.workload == "search-r1"
    mini = args.trajectories if search else None
    if search and args.trajectories is None:
        mini = base.get("ppo_mini_batch_size") or 256
    overrides = {
        "num_ranks": 1,
        "use_ray": False,
        "max_staleness": 10**9,  # the bench's trajectories are all of version 0
        "ppo_mini_batch_size": mini,
        "micro_batch_tokens": args.budget
        or base.get("micro_batch_tokens")
        or (16384 if args.shape else 4096),
        "groups_per_step": args.groups if not search else base.get("groups_per_step", 1),
    }
    if args.cpu_offload:
        overrides["cpu_offload"] = True
    if args.chunk_tokens:
        overrides["logprob_chunk_tokens"] = args.chunk_tokens
    if args.compile != "auto":
        overrides["compile"] = args.compile == "true"
    if args.logprob_head != "auto":
        overrides["logprob_head"] = args.logprob_head
    if args.checkpointing_every is not None:
        overrides["gradient_checkpointing_every"] = args.checkpointing_every
    lora_asked = args.lora_rank or args.lora_targets is not None
    if lora_asked:  # learner.lora, over the preset's own where it has one
        lora = (base.get("lora") or {}) | ({"rank": args.lora_rank} if args.lora_rank else {})
        targets = {} if args.lora_targets is None else {"target_modules": args.lora_targets.split(",")}
        overrides["lora"] = lora | targets
    checkpointing = args.checkpointing
    if checkpointing is None and config is None:
        checkpointing = "full" if args.shape in CHECKPOINTED_SHAPES else "none"

    def build(policy: str | None):
        fields = overrides | ({} if policy is None else {"gradient_checkpointing": policy})
        try:
            return LearnerConfig.model_validate(base | fields)
        except ValidationError as err:
            raise SystemExit(f"bench_learner.py: bad learner settings: {err}") from None

    cfg = build(checkpointing)
    updates = args.updates if search else 1
    reference, policy_pass, critic = step_passes(cfg, updates * cfg.ppo_epochs > 1)

    def plan(cfg, ranks: int):
        from learner.execution.plan import plan_execution

        return plan_execution(
            cfg,
            model_dir,
            replace(world, world_size=ranks),
            dtype,
            reference=reference and cfg.lora is None,  # LoRA's reference is the base itself: no copy
            critic=critic,
            attention=args.attention,
        )

    why = None
    try:
        if args.checkpointing_for_ranks:
            ranks = args.checkpointing_for_ranks
            chosen = plan(build("auto"), ranks)
            detail = chosen.memory.reason if chosen.memory else f"auto on {world.device.type}"
            why = f"what a learner of {ranks} ranks picks: {detail}"
            cfg = build(chosen.checkpointing).model_copy(
                update={"gradient_checkpointing_every": chosen.checkpointing_every}
            )
        execution = plan(cfg, 1)
    except ValueError as err:  # the step cannot fit one rank here (learner/execution/memory.py's estimate)
        print(f"bench_learner.py: {err}" + (f" ({why})" if why else ""), file=sys.stderr)
        raise SystemExit(DOES_NOT_FIT) from None
    cfg = cfg.model_copy(
        update={
            "gradient_checkpointing": execution.checkpointing,
            "gradient_checkpointing_every": execution.checkpointing_every,
        }
    )
    if args.plain and cfg.lora is not None:
        raise SystemExit(
            "bench_learner.py: the plain step trains every weight, not adapters; run LoRA with --no-plain"
        )
    if args.plain and critic:
        raise SystemExit("bench_learner.py: the plain step has no critic; run this preset with --no-plain")
    if args.plain and execution.checkpointing not in PLAIN_CHECKPOINTING:
        raise SystemExit(
            f"bench_learner.py: the plain step checkpoints {', '.join(PLAIN_CHECKPOINTING)}, not "
            f"{execution.checkpointing}; run it with --no-plain"
        )
    if args.padded and (search or reference):
        raise SystemExit(
            "bench_learner.py: --padded runs the toy workload without a reference forward only "
            "(the padded step makes one update and no reference forward)"
        )
    spec = None
    if search:
        spec = workloads.SearchR1Spec.of(
            config if config is not None else _default_config(), args.workload_profile, args.length_scale
        )
    longest = (
        spec.workload.prompt_tokens.value + spec.limits.max_response_tokens
        if spec is not None
        else args.max_len
    )
    if cfg.micro_batch_tokens < longest:
        raise SystemExit(
            f"bench_learner.py: micro_batch_tokens ({cfg.micro_batch_tokens}) must hold the longest trajectory "
            f"({longest:.0f} tokens)"
        )
    generators = config.generators if config is not None else None
    return Settings(
        cfg=cfg,
        dtype=dtype,
        execution=execution,
        checkpointing_why=why,
        updates=updates,
        reference=reference,
        policy_pass=policy_pass,
        kl_coef=float(cfg.algorithm.kl_coef),
        temperature=generators.temperature if generators is not None else 1.0,
        max_response_tokens=spec.limits.max_response_tokens if spec is not None else None,
        spec=spec,
    )


def step_passes(cfg, several_updates: bool) -> tuple[bool, bool, bool]:
    """(reference forward, the policy's proximal forward, a critic) of `Learner.train_step` under `cfg`: the
    trainer's own decisions, asked of it rather than restated."""
    from types import SimpleNamespace

    from learner.algorithms import build_algorithm
    from learner.trainer import Learner

    algorithm = build_algorithm(cfg.algorithm, cfg.correction)
    policy_pass = Learner._needs_policy_pass(SimpleNamespace(algorithm=algorithm), several_updates)
    return algorithm.needs_reference, policy_pass, algorithm.needs_values


def _default_config():
    from config.loader import load_config

    return load_config(DEFAULT_PRESET)


def step_plan(args, settings: Settings, vocab: int) -> Plan:
    """The groups of every step, drawn with a fixed seed (the same batches for every mode)."""
    import numpy as np

    rng = np.random.default_rng(0)
    if settings.spec is None:
        batches = [
            workloads.tiny_groups(rng, args.groups, args.group_size, args.max_len, vocab)
            for _ in range(args.steps + 1)
        ]
        return Plan(
            warmup=batches,  # every batch once, untimed
            timed=batches[1:],
            profile=batches[1],
            describe=f"tiny (toy mix: {args.groups} groups x {args.group_size} trajectories, prompts 32-127 "
            f"tokens, lognormal responses, <= {args.max_len} tokens; one update per step, no reference)",
        )
    spec, mini = settings.spec, settings.cfg.ppo_mini_batch_size
    warm_updates = min(
        settings.updates, 2
    )  # several updates where the step makes several (the proximal pass)
    warmup = args.warmup_trajectories if args.warmup_trajectories is not None else max(1, mini // 4)
    return Plan(
        warmup=[workloads.search_r1_groups(rng, spec, warmup * warm_updates, vocab, "warmup")]
        if warmup
        else [],
        warmup_mini_batch=warmup or None,
        timed=[
            workloads.search_r1_groups(rng, spec, mini * settings.updates, vocab, f"step{i}")
            for i in range(args.steps)
        ],
        profile=workloads.search_r1_groups(rng, spec, args.profile_trajectories, vocab, "profile")
        if args.profile
        else [],
        describe=f"{spec.describe()}; {settings.updates} update(s) of {mini} trajectories per step",
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The options, with their defaults resolved (device, workload, preset, sizes); `--logprob-memory` hands them
    to scripts/bench/logprob_memory.py."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--logprob-memory" in argv:
        import scripts.bench.logprob_memory as logprob_memory

        return logprob_memory.parse(argv)
    parser = argparse.ArgumentParser(description="Learner throughput, measured as the trainer runs it")
    parser.add_argument("--quick", action="store_true", help="a short run (fewer, smaller steps)")
    parser.add_argument("--json", action="store_true", help="print one JSON object with every figure")
    parser.add_argument("--json-out", default=None, metavar="FILE", help="also write the JSON object to FILE")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--model", default=None, help="HF model directory (default: a small random Qwen2)")
    parser.add_argument(
        "--shape", default=None, choices=list(SHAPES), help="a random-init Qwen2.5 of this shape"
    )
    parser.add_argument("--shape-cache", default=None, metavar="DIR", help="keep --shape models here, reused")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="compute dtype")
    parser.add_argument(
        "--workload",
        default=None,
        choices=workloads.WORKLOADS,
        help="search-r1: Search-R1's step (default with --shape); tiny: the old toy mix (default otherwise)",
    )
    parser.add_argument(
        "--preset",
        default=None,
        help=f"the preset whose learner settings to use (default with search-r1: {DEFAULT_PRESET})",
    )
    parser.add_argument(
        "--workload-profile",
        default=workloads.DEFAULT_PROFILE,
        help="the planner profile (sr1/plan/profiles/) whose workload draws the search-r1 trajectories",
    )
    parser.add_argument("--trajectories", type=int, default=None, help="search-r1: trajectories per update")
    parser.add_argument(
        "--updates", type=int, default=2, help="search-r1: updates (mini-batches) per timed step"
    )
    parser.add_argument(
        "--warmup-trajectories",
        type=int,
        default=None,
        help="search-r1: per update of the warm-up step (0: none)",
    )
    parser.add_argument(
        "--length-scale", type=float, default=1.0, help="search-r1: every length times this (small CPU runs)"
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps per mode")
    parser.add_argument("--groups", type=int, default=None, help="tiny: groups per step")
    parser.add_argument("--group-size", type=int, default=8, help="tiny: trajectories per group")
    parser.add_argument("--max-len", type=int, default=1024, help="tiny: longest prompt + response")
    parser.add_argument("--budget", type=int, default=None, help="micro_batch_tokens (default: the preset's)")
    parser.add_argument(
        "--attention",
        default="auto",
        choices=["auto", *IMPLEMENTATIONS],
        help="the learner's attention for packed rows (learner/execution/attention.py; auto: the learner's choice)",
    )
    parser.add_argument(
        "--compile",
        default="auto",
        choices=["auto", "true", "false"],
        help="learner.compile (auto: the preset's, else compiled on CUDA)",
    )
    parser.add_argument(
        "--logprob-head",
        default="auto",
        choices=["auto", "fused", "chunked"],
        help="learner.logprob_head (auto: the preset's, else fused on CUDA)",
    )
    parser.add_argument(
        "--checkpointing",
        nargs="?",
        const="full",
        default=None,
        choices=["auto", *POLICIES],
        help="learner.gradient_checkpointing (default: the preset's; without one, full from 1.5B)",
    )
    parser.add_argument(
        "--no-checkpointing",
        dest="checkpointing",
        action="store_const",
        const="none",
        help="--checkpointing none",
    )
    parser.add_argument(
        "--checkpointing-every", type=int, default=None, help="every_n: recompute every N-th layer"
    )
    parser.add_argument(
        "--checkpointing-for-ranks",
        type=int,
        default=None,
        metavar="N",
        help="the checkpointing a learner of N ranks picks on this device (learner/execution/memory.py), "
        "run at one rank",
    )
    parser.add_argument("--cpu-offload", action="store_true", help="learner.cpu_offload")
    parser.add_argument("--lora-rank", type=int, default=None, help="learner.lora.rank: train LoRA adapters")
    parser.add_argument(
        "--lora-targets",
        default=None,
        metavar="A,B",
        help="learner.lora.target_modules (default: every linear)",
    )
    parser.add_argument(
        "--plain",
        "--reference",
        dest="plain",
        default=None,
        action=argparse.BooleanOptionalAction,
        help="run the plain PyTorch step too (default: on CUDA)",
    )
    parser.add_argument(
        "--padded", default=None, action=argparse.BooleanOptionalAction, help="the padded mode"
    )
    parser.add_argument(
        "--reference-row", type=int, default=2048, help="tokens per dense row of the plain step"
    )
    parser.add_argument("--peak-flops", type=float, default=None, help="peak FLOP/s for MFU (CUDA: 989e12)")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="top N ops of one profiled step")
    parser.add_argument(
        "--profile-trajectories", type=int, default=8, help="search-r1: trajectories of the profiled step"
    )
    parser.add_argument(
        "--chunk-tokens", type=int, default=None, help="learner.logprob_chunk_tokens (default: the preset's)"
    )
    parser.add_argument(
        "--logprob-memory",
        action="store_true",
        help="the LM head's memory instead (scripts/bench/logprob_memory.py)",
    )
    args = parser.parse_args(argv)
    args.logprob_memory = False
    import torch

    cuda = torch.cuda.is_available() if args.device == "auto" else args.device == "cuda"
    args.device = "cuda" if cuda else "cpu"
    args.workload = args.workload or ("search-r1" if args.shape else "tiny")
    search = args.workload == "search-r1"
    if search:
        args.preset = args.preset or DEFAULT_PRESET
        if args.quick:
            args.trajectories = args.trajectories or 32
            args.warmup_trajectories = 8 if args.warmup_trajectories is None else args.warmup_trajectories
        args.steps = args.steps or 1
    else:
        args.steps = args.steps or (2 if args.quick else 5)
        args.groups = args.groups or (2 if args.quick else 8 if args.shape else 4)
    if args.plain is None:
        args.plain = cuda and not (args.lora_rank or args.lora_targets is not None)  # no LoRA plain step
    if args.padded is None:
        args.padded = not search
    if args.peak_flops is None and cuda:
        args.peak_flops = H100_BF16_FLOPS
    for name in ("trajectories", "updates", "steps", "profile_trajectories", "lora_rank"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.warmup_trajectories is not None and args.warmup_trajectories < 0:
        parser.error(f"--warmup-trajectories must be >= 0, got {args.warmup_trajectories}")
    return args
