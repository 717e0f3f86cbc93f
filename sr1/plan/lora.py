"""LoRA in `sr1 plan`: a LoRA learner's figures derived from a full-weight profile, and the layout where an engine
and a learner rank share one GPU.

    adapter_parameters(shape, rank=16, targets=LORA_TARGETS)   # trainable parameters (29.9M for Qwen2.5-3B)
    lora_profile(profile, cfg.learner.lora, tokens=16384, chunk_tokens=1024, policy="auto",
                 kind=gpu_kind("h100"), max_loras=3)         # the profile a LoRA learner plans with
    shared_gpu_refusal(cfg, profile, kind, learner_gib, engine_gib)   # why an engine and a rank cannot share a GPU

Nothing here is measured: every LoRA figure is a derivation from the full-weight profile's figures and the model's
shape, and its source says how (docs/plan-model.md, "LoRA"):

- the learner's tokens/s: the full-weight figure times the ratio of matmul FLOPs per token. A full-weight step does
  the forward (2P), the activations' gradients (2P), the weights' gradients (2P) and recomputes `recomputed_forwards`
  forwards (2P each). A LoRA step skips the frozen base's weight gradients and recomputes only what its own memory
  plan needs (`learner/execution/memory.py`'s policies and headroom, with the LoRA state below), plus the adapters'
  own 6A. The same achieved FLOP rate is assumed: the adapters' small matmuls run slower than the base's;
- the learner's memory: `learner/execution/memory.py`'s own LoRA estimate: the frozen base in the compute dtype (no
  gradient, no moments), the adapters in fp32 with their gradients and two AdamW moments (16 bytes each), sharded; the KL
  reference is the same model with the adapters disabled (0 bytes); activations at the chosen policy;
- the publish: the adapter's bf16 bytes instead of the full weights', scaled from the full-weight publish time;
  no engine pause (each version loads as its own vLLM adapter beside the older ones);
- the engine: its curve times `generator.lora_decode_speed` (vLLM's LoRA kernels), and `max_loras` adapter slots
  in its memory;
- a checkpoint: the adapters and their optimizer state only, scaled from the full-weight checkpoint time by bytes.
"""

from __future__ import annotations

import json
from typing import Any

from learner.execution.memory import (
    AUTO_EVERY,
    AUTO_HEADROOM,
    GIB,
    POLICIES,
    MemorySettings,
    StepShape,
    checkpointed_layers,
    memory_of,
)
from sr1.plan.figures import ModelShape
from sr1.plan.profile import GpuKind, Profile, ProfileError, validate_profile

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
WIRE_BYTES = 2  # the adapter goes to the engines in the model's dtype (bf16 on GPUs), as full weights do
# bytes a checkpoint writes per parameter: bf16 weights (2) and the fp32 resume state (16), as the profiles count
FULL_CHECKPOINT_BYTES = 18
LORA_CHECKPOINT_BYTES = 14  # per adapter parameter: fp32 weights and two moments (12), the bf16 export (2)


def module_dims(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """(input, output) features of each linear layer of one decoder layer."""
    h, i = shape.hidden, shape.intermediate
    kv = h // shape.heads * shape.kv_heads
    return {
        "q_proj": (h, h),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (h, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }


def adapter_parameters(shape: ModelShape, rank: int, targets: list[str] | tuple[str, ...]) -> int:
    """Trainable parameters of rank-`rank` adapters on `targets` of every layer: r x (in + out) per module."""
    dims = module_dims(shape)
    unknown = [t for t in targets if t not in dims]
    if unknown:
        raise ProfileError(
            f"the planner knows no linear layer {unknown} in a decoder layer; known: {list(dims)}"
        )
    return shape.layers * sum(rank * (dims[t][0] + dims[t][1]) for t in targets)


def step_shape(profile: Profile) -> StepShape:
    """`learner/execution/memory.py`'s shape of the profile's model (a ProfileError when the profile has none)."""
    s = profile.shape
    if s is None:
        raise ProfileError(
            f"profile {profile.name!r} has no `shape` section (hidden, intermediate, layers, heads, kv_heads, "
            "vocab): the LoRA figures are derived from it"
        )
    params = round(profile.params_billion.value * 1e9)
    return StepShape(params, s.hidden, s.intermediate, s.layers, s.heads, s.kv_heads, s.vocab)


def lora_memory_plan(
    profile: Profile,
    lora,
    *,
    tokens: int,
    chunk_tokens: int,
    policy: str,
    capacity_gib: float | None,
    compute_bytes: int = WIRE_BYTES,
) -> tuple[str, float]:
    """(checkpointing policy, GiB per rank beside the sharded state) of a LoRA step of `tokens`, by
    `learner/execution/memory.py`'s own LoRA estimate: the named policy, or for `auto` the least recompute whose peak
    on one rank (the tightest case of a plan) fits `capacity_gib`, in learner/execution/memory.py's order and with its
    headroom."""
    shape = step_shape(profile)
    adapters = adapter_parameters(profile.shape, lora.rank, lora.target_modules)
    state = (
        compute_bytes * shape.parameters + 16 * adapters
    )  # the frozen base and the trained adapters, one rank

    def peak(p: str) -> float:
        settings = MemorySettings(
            tokens=tokens,
            chunk_tokens=chunk_tokens,
            checkpointing=p,
            compute_bytes=compute_bytes,
            lora_parameters=adapters,
        )
        return memory_of(shape, settings).peak(tokens) / GIB

    chosen = policy
    if policy == "auto":
        fits = [p for p in POLICIES if capacity_gib is None or peak(p) <= AUTO_HEADROOM * capacity_gib]
        chosen = fits[0] if fits else "full"
    return chosen, peak(chosen) - state / GIB


def _figure(value: float, source: str) -> dict[str, Any]:
    return {"value": value, "source": source}


def lora_profile(
    profile: Profile,
    lora,
    *,
    tokens: int,
    chunk_tokens: int,
    policy: str,
    kind: GpuKind,
    max_loras: int,
    learner_share: float = 1.0,
    wire_bytes: int = WIRE_BYTES,
) -> Profile:
    """`profile` (full-weight figures) as a LoRA learner of `lora` (`learner.lora`: rank, target_modules) plans
    with: every changed figure's source says it is derived and how. `learner_share`: the part of the GPU the
    learner may use (a shared GPU)."""
    if profile.shape is None:
        step_shape(profile)  # raises, naming the missing section
    shape, params = profile.shape, profile.params_billion.value * 1e9
    adapters = adapter_parameters(shape, lora.rank, lora.target_modules)
    every_linear = adapter_parameters(shape, lora.rank, LORA_TARGETS)
    capacity = None if kind.memory_gib is None else kind.memory_gib * learner_share
    chosen, beside = lora_memory_plan(
        profile,
        lora,
        tokens=tokens,
        chunk_tokens=chunk_tokens,
        policy=policy,
        capacity_gib=capacity,
        compute_bytes=wire_bytes,
    )
    modes = checkpointed_layers(chosen, shape.layers, AUTO_EVERY)  # every_n as auto picks it
    lora_recompute = modes.count("full") / shape.layers  # selective recomputes pointwise ops only: no matmuls
    measured = profile.learner.recomputed_forwards
    full_recompute = measured.value if measured is not None else 0.0
    full_flops = (6 + 2 * full_recompute) * params
    lora_flops = (4 + 2 * lora_recompute) * params + (6 + 2 * lora_recompute) * adapters
    ratio = full_flops / lora_flops
    learner, tag = profile.learner, f"rank {lora.rank} on {', '.join(lora.target_modules)}"
    data = json.loads(profile.model_dump_json())
    full_tps = learner.tokens_per_s_per_rank.value
    data["learner"] |= {
        "tokens_per_s_per_rank": _figure(
            full_tps * ratio,
            f"derived, not measured: the full-weight {full_tps:,.0f} tokens/s x {ratio:.3f}, the ratio of matmul "
            f"FLOPs per token: full ({6 + 2 * full_recompute:g}P: forward, both gradients, "
            f"{full_recompute:g} recomputed forward{'' if measured else ', the profile names none'}) over LoRA "
            f"({4 + 2 * lora_recompute:g}P + {6 + 2 * lora_recompute:g}A: no base weight gradients, recompute "
            f"'{chosen}'), P = {params / 1e9:.2f}B, A = {adapters / 1e6:.1f}M adapter parameters ({tag}); the same "
            "achieved FLOP rate is assumed (the adapters' small matmuls run below it)",
        ),
        "bytes_per_param": _figure(
            wire_bytes + 16 * adapters / params,
            f"derived: the frozen base in the compute dtype ({wire_bytes} bytes a parameter, no gradient or moments) "
            f"and the {adapters:,} "
            "adapter parameters' fp32 weights, gradients and two AdamW moments (16 bytes each), per base parameter",
        ),
        "reference_bytes_per_param": _figure(
            0.0, "derived: the KL reference is the same model with the adapters disabled, never a second copy"
        ),
        "critic_bytes_per_param": _figure(
            16.0,
            "learner/execution/memory.py: a PPO critic beside a LoRA policy trains every weight (fp32, AdamW)",
        ),
        "activation_gib": _figure(
            beside,
            f"derived: learner/execution/memory.py's estimate at {tokens:,}-token micro-batches with recompute '{chosen}' "
            f"(the least that fits {'the GPU' if capacity is None else f'{capacity:.0f} GiB'} with the LoRA state), "
            "less the sharded state: unsharded bf16 layers, activations, the log-prob head's transient",
        ),
        "checkpoint_s": _figure(
            learner.checkpoint_s.value * LORA_CHECKPOINT_BYTES * adapters / (FULL_CHECKPOINT_BYTES * params),
            f"derived: the full-weight {learner.checkpoint_s.value:g} s scaled by bytes written, the adapters' "
            f"fp32 weights, moments and bf16 export ({LORA_CHECKPOINT_BYTES} x {adapters / 1e6:.1f}M) against "
            f"the full checkpoint ({FULL_CHECKPOINT_BYTES} x {params / 1e9:.2f}B)",
        ),
    }
    full_bytes, adapter_bytes = params * wire_bytes, adapters * wire_bytes
    sync = profile.weight_sync_s.value
    data["weight_sync_s"] = _figure(
        sync * adapter_bytes / full_bytes,
        f"derived: the full-weight publish ({sync:g} s for {full_bytes / 1e9:.2f} GB) scaled by the bytes sent, "
        f"the adapter's {adapter_bytes / 1e6:.1f} MB at {wire_bytes} bytes a parameter ({adapter_bytes / full_bytes:.2%})",
    )
    data["engine_pause_s"] = _figure(
        0.0,
        "by design: each version loads as a vLLM LoRA adapter named sr1-v{version} beside the older ones while "
        "the engine decodes; no pause_generation (docs/lora.md)",
    )
    speed = profile.generator.lora_decode_speed
    if speed is None:
        raise ProfileError(
            f"profile {profile.name!r} has no generator.lora_decode_speed: an engine's tokens/s serving an adapter "
            "as a share of the base model's: add it to the profile with its source (the H100 profiles' 0.66 is "
            "vLLM's published figure)"
        )
    curve = data["generator"]["tokens_per_s"]
    curve["points"] = [[n, rate * speed.value] for n, rate in curve["points"]]
    curve["source"] = f"x {speed.value:g} for LoRA (generator.lora_decode_speed) of: {curve['source']}"
    slots = max_loras * every_linear * wire_bytes / GIB  # vLLM sizes its slots for every linear layer
    data["generator"]["adapter_gib"] = _figure(
        slots,
        f"derived: {max_loras} adapter slots (max_loras) of rank {lora.rank} on every linear layer ({wire_bytes} bytes a parameter), "
        f"{every_linear * wire_bytes / 1e6:.1f} MB each",
    )
    data["name"], data["lora"] = f"{profile.name}, LoRA {tag} (derived)", tag
    return validate_profile(data, data["name"])


def adapter_summary(profile: Profile, lora, wire_bytes: int = WIRE_BYTES) -> dict[str, float]:
    """The adapter's size beside the full weights, for the report: parameters, bytes per update, their share."""
    adapters = adapter_parameters(profile.shape, lora.rank, lora.target_modules)
    params = profile.params_billion.value * 1e9
    return {
        "adapter_parameters": adapters,
        "adapter_bytes": adapters * wire_bytes,
        "full_bytes": params * wire_bytes,
        "bytes_share": adapters / params,
    }


def shared_gpu_refusal(
    cfg, profile: Profile, kind: GpuKind, learner_gib: float, engine_gib: float
) -> str | None:
    """Why an engine and a learner rank cannot share each GPU with this config, or None when they can. Needs: the
    engines' `gpu_memory_utilization` set to their share and the learner's memory within the rest; a weight-sync
    channel that does not put two ranks of one NCCL communicator on a device (NCCL refuses it: 'Duplicate GPU
    detected'); sr1 has no CUDA-IPC channel, so the update goes over gloo through host memory; and the local
    launcher, which puts engine i on GPU i and learner rank r on cuda:r (Ray gives each a whole GPU)."""
    if profile.shared_gpu_speed is None:
        return "the profile has no shared_gpu_speed (each one's speed while both are busy on one GPU)"
    if cfg.generators.engine.tensor_parallel_size != 1:
        return "an engine with tensor_parallel_size > 1 spans GPUs; sharing pairs one engine with one rank"
    backend = cfg.weight_sync.backend
    if backend != "gloo" and kind.memory_gib is not None:
        return (
            f"weight_sync.backend {backend} means NCCL on GPUs, and NCCL refuses two ranks of one communicator "
            "on the same GPU (learner rank 0 and the engine beside it); sr1 has no CUDA-IPC channel: set "
            "weight_sync.backend=gloo to send each update through host memory"
        )
    if cfg.generators.use_ray or cfg.learner.use_ray:
        return (
            "Ray gives every engine and every learner rank a whole GPU (sr1/launch/ray_placement.py); set "
            "generators.use_ray=false and learner.use_ray=false: the local launcher puts engine i on GPU i and "
            "learner rank r on cuda:r"
        )
    if kind.memory_gib is None:
        return None
    share = cfg.generators.engine.gpu_memory_utilization
    if engine_gib > share * kind.memory_gib:
        return (
            f"the engine needs {engine_gib:.1f} GiB, more than its share "
            f"(generators.engine.gpu_memory_utilization {share:.2f} of {kind.memory_gib:.0f} GiB)"
        )
    room = (1 - share) * kind.memory_gib
    if learner_gib > room:
        return (
            f"the learner rank needs {learner_gib:.1f} GiB, more than the {room:.1f} GiB the engine's share "
            f"(generators.engine.gpu_memory_utilization {share:.2f}) leaves it"
        )
    return None
