"""The policy under FSDP2: load an HF causal LM, shard it with `fully_shard`, build AdamW with warmup.

Same code on CPU (gloo) and GPU (NCCL). Master weights stay fp32; with `model.dtype` bfloat16/float16 FSDP2's
MixedPrecisionPolicy casts parameters for compute and reduces gradients in fp32. Each decoder layer is its own
FSDP unit (all-gathered just before it runs, freed after, or with `reshard_after_forward=False` kept until the
trainer lets it go: learner/execution/plan.py decides), the embeddings and head belong to the root unit, which FSDP2
does not reshard after the forward: the log-prob head (learner/packing.py) uses the head's weight between the
forward and the backward. Before FSDP2 wraps a layer, its forward is wrapped for activation checkpointing
(learner/execution/recompute.py) and compiled (learner/execution/compiled.py): `prepare_layers`.

`cpu_offload` (`learner.cpu_offload`): FSDP2's CPUOffloadPolicy keeps the sharded parameters, their gradients and
so the optimizer state in CPU memory, copies each unit to the GPU for its forward/backward, and the optimizer steps
on the CPU. The shards then sit on the CPU while the mesh is CUDA, so DTensor collectives on them (the gradient
norm, `full_tensor()` for checkpoints and weight sync) need a CPU backend: the mesh gets its own `cpu:gloo,cuda:nccl`
group. On a CPU-only run the policy is applied as well (unpinned): nothing moves, but the code path is the GPU's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import torch

from learner.distributed import World
from learner.execution.attention import attention_implementation
from learner.execution.compiled import compiled_forward
from learner.execution.memory import checkpointed_layers
from learner.execution.recompute import checkpointed_forward
from learner.lora import inject_lora
from learner.settings import LoraSettings

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no .model.layers; the learner shards decoder layers")
    return list(layers)


def _device_mesh(world: World, cpu_offload: bool):
    """The 1-D mesh over all ranks; with CPU offload on GPU, over a group that also has a CPU backend."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    if cpu_offload and world.device.type == "cuda":
        import torch.distributed as dist

        return DeviceMesh.from_group(dist.new_group(backend="cpu:gloo,cuda:nccl"), "cuda")
    return init_device_mesh(world.device.type, (world.world_size,))


def load_policy(
    path: str | Path,
    world: World,
    *,
    dtype: str = "float32",
    gradient_checkpointing: bool | str = False,
    checkpointing_every: int = 2,
    trainable: bool = True,
    cpu_offload: bool = False,
    value_head: bool = False,
    attention: str = "auto",
    compile: bool = False,
    reshard_after_forward: bool = True,
    lora: LoraSettings | None = None,
) -> torch.nn.Module:
    """Load an HF model in fp32 and shard it over the world with FSDP2 (optionally offloaded to CPU memory).

    `value_head`: the model's body with a scalar head in place of the LM head (PPO's critic, learner/critic.py):
    transformers' token-classification class with one label and no dropout on the head. `attention`: how packed
    rows are attended (learner/execution/attention.py; auto picks by device). `gradient_checkpointing`: a policy of
    learner/execution/recompute.py (`full`, `every_n` with `checkpointing_every`, `selective`, `none`; true/false mean
    full/none), applied to each decoder layer's forward, which `compile` then compiles
    (learner/execution/compiled.py), both before FSDP2 wraps the layer. `reshard_after_forward`: whether each layer
    frees its gathered (compute-dtype) parameters after the forward; False keeps them for the backward (no second
    all-gather and cast). `lora` (learner.lora): adapters injected before the layers are wrapped and sharded, the rest
    frozen in `dtype` (learner/lora.py)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    head = {}
    if value_head:
        config = AutoConfig.from_pretrained(str(path), num_labels=1)
        config.classifier_dropout = (
            0.0  # set on the object: transformers drops unknown from_pretrained kwargs
        )
        head = {"config": config}
    model = (AutoModelForTokenClassification if value_head else AutoModelForCausalLM).from_pretrained(
        str(path),
        dtype=torch.float32,
        attn_implementation=attention_implementation(world.device, attention),
        **head,
    )
    model.config.use_cache = False
    if lora is not None:
        trainable = inject_lora(model, lora, DTYPES[dtype])
        if world.is_main:
            total = sum(p.numel() for p in model.parameters())
            log.info(
                "LoRA rank %d on %s: %d trainable parameters (%.2f%% of %d), the base frozen in %s",
                lora.rank,
                ",".join(lora.target_modules),
                trainable,
                100 * trainable / total,
                total,
                dtype,
            )
    layers = prepare_layers(
        model, gradient_checkpointing if trainable else "none", every=checkpointing_every, compile=compile
    )
    mesh = _device_mesh(world, cpu_offload)
    compute = DTYPES[dtype]
    mp = (
        MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
        if compute != torch.float32
        else None
    )
    kwargs = {"mesh": mesh} | ({"mp_policy": mp} if mp is not None else {})
    if cpu_offload:  # pinned host memory for fast copies; pinning needs an accelerator
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=world.device.type == "cuda")
    for layer in layers:
        fully_shard(layer, reshard_after_forward=reshard_after_forward, **kwargs)
    fully_shard(model, **kwargs)
    if not trainable:
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
    return model


def prepare_layers(
    model: torch.nn.Module, checkpointing: bool | str, *, every: int = 2, compile: bool = False
) -> list[torch.nn.Module]:
    """Wrap each decoder layer's forward: checkpointed by policy (learner/execution/recompute.py), then compiled
    (learner/execution/compiled.py). Before FSDP2: its hooks stay around the module call, outside both. Returns the
    layers."""
    if isinstance(checkpointing, bool):
        checkpointing = "full" if checkpointing else "none"
    layers = _decoder_layers(model)
    for layer, mode in zip(layers, checkpointed_layers(checkpointing, len(layers), every), strict=True):
        forward = checkpointed_forward(layer.forward, mode)
        if compile:
            forward = compiled_forward(forward)
        if forward is not layer.forward:
            layer.forward = forward
    return layers


def fsdp_units(model: torch.nn.Module) -> list:
    """The model's FSDP2 units (its decoder layers and the root)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def reshard(model: torch.nn.Module) -> None:
    """Free every unit's gathered parameters and register the shards again (FSDP2's reshard is per unit)."""
    for unit in fsdp_units(model):
        unit.reshard()


def build_optimizer(
    model: torch.nn.Module, cfg
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (on the sharded fp32 parameters) and a linear warmup to the peak learning rate, then constant.

    The fused AdamW kernel, on CUDA and on CPU alike (CPU-resident shards: a CPU run, or `cpu_offload` on a GPU
    machine): one pass over each shard's parameter, gradient and two moments per step, where the per-parameter loop
    (`foreach=False`) launched about a dozen kernels per tensor. It runs on the local shards of FSDP2's DTensors
    (checked on gloo, one and two ranks, and on CUDA by tests/gpu)."""
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=cfg.lr,
        betas=tuple(cfg.betas),
        weight_decay=cfg.weight_decay,
        eps=1e-8,
        fused=True,
    )
    warmup = cfg.warmup_steps

    def factor(step: int) -> float:
        return min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def clip_and_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    max_norm: float,
    loss_nonfinite: torch.Tensor | None = None,
) -> tuple[torch.Tensor, bool]:
    """Clip the global gradient norm and take the optimizer step, unless the norm (or `loss_nonfinite`, a flag
    already agreed on by every rank) is not finite: then the update is skipped. Gradients are cleared either way.

    Returns (the norm before clipping as a 0-d tensor on the device, whether the update was skipped). The norm is
    global (a DTensor reduction), so every rank takes the same decision; deciding reads one flag back to the host,
    once per update."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=True)
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    nonfinite = ~torch.isfinite(grad_norm)
    if loss_nonfinite is not None:
        nonfinite = nonfinite | loss_nonfinite.to(nonfinite.device, torch.bool)
    skipped = bool(nonfinite)
    if not skipped:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm.detach(), skipped


def tied_names(model: torch.nn.Module) -> set[str]:
    """State-dict keys that are copies of another key (lm_head tied to the embeddings)."""
    if getattr(model.config, "tie_word_embeddings", False):
        return {"lm_head.weight"}
    return set()


def named_weights(model: torch.nn.Module, skip_tied: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, sharded tensor) in state-dict order, identical on every rank. Gather with `.full_tensor()`."""
    skip = tied_names(model) if skip_tied else set()
    for name, tensor in model.state_dict().items():
        if name not in skip:
            yield name, tensor


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """Gather a DTensor (a collective: every rank must call it in the same order); plain tensors pass through."""
    gather = getattr(tensor, "full_tensor", None)
    return gather() if gather is not None else tensor
