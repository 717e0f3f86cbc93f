"""Learner throughput, measured as the trainer runs it, against a plain PyTorch step (and padding, on the toy mix).

    python scripts/bench/bench_learner.py [--quick] [--json]                               # CPU: the small model, tiny
    python scripts/bench/bench_learner.py --device cuda --shape qwen2.5-3b [--preset qwen2.5-3b-8xh100] \\
        [--trajectories 256] [--updates 2] [--warmup-trajectories 64] [--checkpointing full|none|...] [--json]
    python scripts/bench/bench_learner.py --device cuda --shape qwen2.5-0.5b --workload tiny     # the old toy mix
    python scripts/bench/bench_learner.py --logprob-memory [...]     # the LM head's memory: scripts/bench/logprob_memory.py
    python scripts/bench/bench_learner.py --device cuda --shape qwen2.5-3b --lora-rank 16 [--lora-targets q_proj,v_proj] \
        --checkpointing auto                                               # the LoRA learner's step (learner.lora)
    python scripts/bench/bench_learner.py --lora [--steps 3] [--rank 16]  # LoRA vs full weights: scripts/bench/bench_learner_lora.py

Workloads (scripts/bench/learner_workloads.py; every printed figure and JSON object names its workload):
- `search-r1` (the default with --shape): Search-R1's step. Trajectories drawn by the planner's sampler from the
  workload of `--workload-profile` (qwen2.5-3b-h100) under the preset's generator budgets, observation tokens out of
  the loss. One timed step is `Learner.train_step` on `--updates` PPO mini-batches of `--trajectories` each (the
  preset's `ppo_mini_batch_size`, 256: one optimizer update per mini-batch, gradient accumulation over its packed
  micro-batches), with everything the trainer does before the updates: the reference forward when the preset has
  `kl_coef > 0`, the policy's proximal forward when its correction recomputes it and the step makes several updates.
  The learner's settings are the preset's (`--preset`: micro_batch_tokens, ppo_mini_batch_size, checkpointing,
  algorithm and KL, correction, dtype on CUDA); one rank. A warm-up step on `--warmup-trajectories` (as many
  updates, untimed) compiles first.
- `tiny`: the toy mix of the figures up to 2026-11-26: `--groups` x `--group-size` short trajectories per step, one
  update, no reference; `--steps` timed steps, every batch run once untimed first.

Modes, in one process, world size 1, each timed from the host with the device synchronised:
- plain (`--plain`, default on CUDA; scripts/bench/learner_baselines.py): a plain PyTorch step on dense rows of
  `--reference-row` tokens, about the learner's tokens per update, the same checkpointing, and the same no-gradient
  forwards per token (reference, proximal) as the learner's step. It runs first and frees its memory.
- packed: `Learner.train_step` itself.
- padded (`--padded`, default with `tiny` only): the learner's model, optimizer and loss on padded micro-batches.

LoRA (`--lora-rank R`, `--lora-targets A,B`: `learner.lora`'s rank and target_modules, over a LoRA preset's own;
targets default to every linear layer of a decoder layer): the learner itself trains adapters on its frozen base
(learner/lora.py, as `sr1 learner` runs it), its KL reference the base with the adapters off. No plain step (it
trains every weight): compare with a full-weight run of the same workload.

Figures: tokens/s counts every token through the policy (prompt, sampled and observation tokens). MFU =
FLOPs per trained token x tokens/s / `--peak-flops` (989e12 on CUDA: H100 SXM and H200 dense bf16), the FLOPs the
step really does (learner_measures.train_flops_per_token: 4 x parameters + 2 x trained parameters): full weights
6P; LoRA on a frozen base of B parameters with A adapter parameters 4B + 6A (forward and activation gradients
through everything, weight gradients for the adapters only; `trained_parameters` = A). The training pass only;
`mfu_all_passes` adds 2 x parameters per token for each no-gradient forward of the step (reference, proximal).
Recomputation, attention's quadratic term and the padding FlexAttention adds are not counted. Peak GiB: the
allocator's high-water mark per mode (CUDA); `estimate_gib`: learner/execution/memory.py's estimate at the step's
largest micro-batch with the step's own settings (with LoRA: the frozen base in the compute dtype, the adapters'
state); compiler counters (learner/execution/compiled.py: frames, graphs,
recompiles, graph breaks) over the learner's part and over its timed steps; `execution`: how the learner ran
(learner/execution/plan.py: attention, with each kernel's measured time where `auto` timed them, compiled layers,
log-prob head, checkpointing and why, FSDP2 settings). `--profile N`: the top N ops of one profiled step (stderr and
JSON).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import scripts.bench.bench_learner_setup as setup  # noqa: E402
import scripts.bench.learner_workloads as workloads  # noqa: E402
from scripts.bench.learner_baselines import padded_micro_batches, padded_step  # noqa: E402
from scripts.bench.learner_measures import (  # noqa: E402
    Timer,
    estimate_peak_bytes,
    profile_step,
    progress,
    provenance,
    train_flops_per_token,
    trained_parameters,
)

ROOT = Path(__file__).resolve().parents[2]


def _small_model(out_dir: Path, max_positions: int) -> str:
    from world.model import build_model, train_tokenizer

    texts = [f"alpha bravo {i} charlie delta echo {i * 7}" for i in range(300)]
    train_tokenizer(texts, out_dir, vocab_size=1024)
    return str(
        build_model(
            out_dir,
            out_dir,
            hidden_size=256,
            num_layers=4,
            num_heads=4,
            num_kv_heads=2,
            intermediate_size=768,
            max_positions=max_positions,
        )
    )


def _model_dir(args, tmp: Path, device) -> str:
    """The model the bench trains: `--model`, a Qwen2.5 shape (`--shape`, cached in `--shape-cache`) or the small
    random Qwen2."""
    if args.model:
        return args.model
    if args.shape:
        from scripts.bench.learner_baselines import shape_model_dir

        return str(shape_model_dir(args.shape, Path(args.shape_cache or tmp), device=device.type))
    return _small_model(tmp, max(args.max_len, 8192) + 8)


@contextlib.contextmanager
def _mini_batch(learner, size: int | None):
    """The learner's ppo_mini_batch_size set to `size` for the steps inside (the warm-up's smaller updates)."""
    saved = learner.cfg
    learner.cfg = saved.model_copy(update={"ppo_mini_batch_size": size})
    try:
        yield
    finally:
        learner.cfg = saved


def _micro_batches(batches, mini: int | None, budget: int) -> tuple[float, int]:
    """Mean packed micro-batches per update and the largest micro-batch (tokens) of the timed steps."""
    from learner.minibatches import mini_batch_slices
    from learner.packing import plan_micro_batches

    counts, largest = [], 0
    for groups in batches:
        lengths = [t.num_tokens for g in groups for t in g.trajectories]
        for indices in mini_batch_slices(len(lengths), mini):
            part = [lengths[i] for i in indices]
            plan = plan_micro_batches(part, budget)
            counts.append(len(plan))
            largest = max(largest, *(sum(part[i] for i in b) for b in plan))
    return sum(counts) / len(counts), largest


def _plain_step(args, settings, model_dir, device, tokens_per_update: float) -> dict:
    """The plain PyTorch step (scripts/bench/learner_baselines.py), alone on the device; freed before the learner is built."""
    from scripts.bench.learner_baselines import PlainStep

    plain = PlainStep(
        model_dir,
        device,
        checkpointing=settings.checkpointing,
        checkpointing_every=settings.checkpointing_every,
        bf16=settings.dtype == "bfloat16",
        chunk_tokens=settings.cfg.logprob_chunk_tokens,
        kl_coef=settings.kl_coef if settings.reference else 0.0,
        policy_forward=settings.policy_pass,
    )
    row_len = min(args.reference_row, settings.cfg.micro_batch_tokens)
    rows = max(1, settings.cfg.micro_batch_tokens // row_len)
    micro_batches = max(
        1, round(tokens_per_update / (rows * row_len))
    )  # about the learner's tokens per update
    with progress("plain: warm-up update"):
        plain.step(rows, row_len, micro_batches)
    timer = Timer(device)
    updates = args.steps * settings.updates * settings.cfg.ppo_epochs
    with progress(f"plain: {updates} timed update(s)"):
        for i in range(updates):
            timer(
                lambda i=i: plain.step(rows, row_len, micro_batches, seed=i + 1),
                rows * row_len * micro_batches,
            )
    parameters = plain.parameters
    plain.close()
    figures = timer.figures("plain", parameters, args.peak_flops, settings.no_grad_passes)
    figures["plain/shape"] = f"{micro_batches} x {rows} rows x {row_len} tokens per update"
    return figures


def run(args) -> dict:
    from transformers import AutoConfig

    from learner.distributed import init_distributed, shutdown_distributed
    from learner.execution.compiled import compile_counters
    from learner.trainer import Learner

    world = init_distributed(args.device)
    device = world.device
    tmp = tempfile.TemporaryDirectory()
    model_dir = _model_dir(args, Path(tmp.name), device)
    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    settings = setup.learner_settings(args, model_dir, world)
    plan = setup.step_plan(args, settings, vocab)
    epochs = settings.cfg.ppo_epochs  # every PPO epoch trains every token again
    tokens = [workloads.batch_tokens(groups) * epochs for groups in plan.timed]
    updates = settings.updates * epochs
    result = {
        "workload": args.workload,
        "workload_detail": plan.describe,
        "device": str(device),
        **provenance(device),
        "shape": args.shape or args.model or "small Qwen2",
        "preset": args.preset,
    }

    # 1. the plain PyTorch step, alone on the device
    plain = {}
    if args.plain:
        plain = _plain_step(args, settings, model_dir, device, sum(tokens) / (len(tokens) * updates))

    # 2. the learner: its own step on packed micro-batches (and its model, optimizer and loss on padded ones)
    counters_start = compile_counters()
    with progress("learner: loading"):
        learner = Learner(
            settings.cfg,
            model_dir,
            world,
            model_dtype=settings.dtype,
            temperature=settings.temperature,
            max_response_tokens=settings.max_response_tokens,
            attention=args.attention,
        )
    assert learner.model.training, "the learner trains in train mode (checkpointing is off in eval mode)"
    parameters = sum(p.numel() for p in learner.model.parameters())  # with LoRA: the base and the adapters
    trained = trained_parameters(learner)
    steps = {"packed": learner.train_step}
    if args.padded:
        steps["padded"] = lambda groups: padded_step(learner, groups, settings.cfg.micro_batch_tokens)
    # warm-up, untimed: compilation (FlexAttention compiles once per new shape regime, then for dynamic shapes) stays
    # out of the timed steps; then the modes interleave step by step (alternating which goes first) so that load from
    # other processes on a shared machine hits them alike
    with _mini_batch(learner, plan.warmup_mini_batch):
        for mode in steps:
            for i, groups in enumerate(plan.warmup):
                with progress(f"{mode}: warm-up step {i + 1} of {len(plan.warmup)}"):
                    steps[mode](groups)
    counters_warm = compile_counters()
    timers = {mode: Timer(device) for mode in steps}
    order = list(steps)
    for i, groups in enumerate(plan.timed):
        for mode in order if i % 2 == 0 else order[::-1]:
            with progress(f"{mode}: timed step {i + 1} of {len(plan.timed)}"):
                timers[mode](lambda mode=mode, groups=groups: steps[mode](groups), tokens[i])
    counters_end = compile_counters()
    profile = {}
    if args.profile:
        with progress("packed: profiled step"):
            profile = profile_step(lambda: learner.train_step(plan.profile), device, args.profile)
    mean_mbs, largest = _micro_batches(
        plan.timed, settings.cfg.ppo_mini_batch_size, settings.cfg.micro_batch_tokens
    )
    estimate = estimate_peak_bytes(learner, parameters, largest)
    execution = learner.execution
    shutdown_distributed()
    tmp.cleanup()

    result |= {
        "parameters": parameters,
        "dtype": settings.dtype,
        "attention": execution.attention,
        "attention_seconds": execution.attention_seconds,
        "compile": execution.compile,
        "logprob_head": execution.logprob_head,
        "execution": execution.describe(),
        "gradient_checkpointing": execution.checkpointing,
        "gradient_checkpointing_why": settings.checkpointing_why,
        "cpu_offload": settings.cfg.cpu_offload,
        "micro_batch_tokens": settings.cfg.micro_batch_tokens,
        "steps": args.steps,
        "updates_per_step": settings.updates,
        "trajectories_per_update": settings.cfg.ppo_mini_batch_size,
        "warmup_trajectories": sum(len(g.trajectories) for groups in plan.warmup for g in groups),
        "ppo_epochs": epochs,
        "tokens_per_update": sum(tokens) / (len(tokens) * updates),
        "micro_batches_per_update": mean_mbs,
        "largest_micro_batch": largest,
        **workloads.batch_stats(plan.timed),
        "reference_forward": settings.reference,
        "proximal_forward": settings.policy_pass,
        "kl_coef": settings.kl_coef,
        "peak_flops": args.peak_flops,
        "lora": None if settings.cfg.lora is None else settings.cfg.lora.model_dump(),
        "trained_parameters": trained,
        "train_flops_per_token": train_flops_per_token(parameters, trained),
        **timers["packed"].figures("packed", parameters, args.peak_flops, settings.no_grad_passes, trained),
        "packed/estimate_gib": None if estimate is None else estimate / 2**30,
        **plain,
    }
    if args.padded:
        from learner.packing import sequences_from_groups

        sequences = sequences_from_groups(plan.timed[0], [g.rewards * 0 for g in plan.timed[0]])
        budget = settings.cfg.micro_batch_tokens
        computed = sum(len(b) * max(len(s) for s in b) for b in padded_micro_batches(sequences, budget))
        result |= timers["padded"].figures("padded", parameters, args.peak_flops, 0, trained)
        result["padded/pad_fraction"] = 1 - tokens[0] / computed
        result["ratio_packed_over_padded"] = result["packed/tokens_per_s"] / result["padded/tokens_per_s"]
    if plain:
        result["ratio_packed_over_plain"] = result["packed/tokens_per_s"] / result["plain/tokens_per_s"]
    for prefix, since in (("compiler", counters_start), ("compiler/timed", counters_warm)):
        for key, value in counters_end.items():
            result[f"{prefix}/{key}"] = value - since[key]
    return result | profile


def _print(result: dict) -> None:
    print(f"workload: {result['workload']} — {result['workload_detail']}")
    for key, value in result.items():
        if key in ("workload", "workload_detail", "profile/top"):
            continue
        print(f"{key:32s} {value:.3f}" if isinstance(value, float) else f"{key:32s} {value}")


def measure(argv: list[str] | None = None) -> tuple[dict, bool]:
    """Parse the options, run the modes, return (figures, --json given). Also used by bench_weight_sync.py."""
    args = setup.parse(argv)
    return _measure(args), args.json


def _measure(args) -> dict:
    if args.logprob_memory:
        import scripts.bench.logprob_memory as logprob_memory

        return logprob_memory.measure(args)
    return run(args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--lora" in argv:  # the LoRA step against the full-weight step, each in its own process
        import scripts.bench.bench_learner_lora as bench_learner_lora

        return bench_learner_lora.main([a for a in argv if a != "--lora"])
    args = setup.parse(argv)
    result = _measure(args)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result))
    elif "sizes" in result:
        import scripts.bench.logprob_memory as logprob_memory

        logprob_memory.print_table(result)
    else:
        _print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
