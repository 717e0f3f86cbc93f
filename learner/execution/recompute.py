"""Activation checkpointing of decoder layers, by policy: recompute a whole layer in the backward (`full`), only its
cheap ops (`selective`), or nothing.

    forward = checkpointed_forward(layer.forward, "selective")    # before torch.compile and FSDP2 wrap the layer
    layer.forward = forward

`full` is non-reentrant `torch.utils.checkpoint`: the layer keeps its inputs and runs its forward again in the
backward. `selective` is the same call with a selective-checkpoint policy: the outputs of matrix products and of
the attention kernels are saved in the forward (recomputing them costs what the forward did), everything else
(RMSNorm, RoPE, SiLU, the products and sums around them: memory-bound, cheap) is recomputed. Which layers run how
is `learner.execution.memory.checkpointed_layers`; which policy fits the GPU is `learner.execution.memory.plan_memory`.

The wrapper goes around the layer's `forward`, inside the module call: FSDP2's hooks (all-gather before the forward,
the pre-backward all-gather) stay outside the checkpointed region, so a recompute runs on parameters FSDP2 has
already gathered for the backward. Under torch.compile the checkpoint (and its policy) is traced into the layer's
graph, where the partitioner honours it.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

import torch

# ops whose outputs `selective` saves: matrix products and attention (their recompute would cost a forward)
_SAVED_OP_NAMES = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_flash_attention_forward",
    "_efficient_attention_forward",
)


@functools.cache
def saved_ops() -> frozenset:
    """The aten overloads (present in this torch) whose outputs `selective` keeps."""
    ops = set()
    for name in _SAVED_OP_NAMES:
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None:
            ops.update(getattr(packet, overload) for overload in packet.overloads())
    flex = getattr(torch.ops.higher_order, "flex_attention", None)
    if flex is not None:
        ops.add(flex)
    try:  # torch's varlen kernel registers its op when its module is imported
        importlib.import_module("torch.nn.attention.varlen")
        ops.add(torch.ops.torch_attn._varlen_attn.default)
    except (ImportError, AttributeError):
        pass
    return frozenset(ops)


def _selective_policy(_ctx, op, *_args, **_kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in saved_ops() else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context():
    """The context pair torch.utils.checkpoint runs a selective checkpoint in (a fresh cache per call)."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_selective_policy)


def checkpointed_forward(forward: Callable, mode: str) -> Callable:
    """`forward` recomputed in the backward: `full` (all of it) or `selective` (all but matmuls and attention);
    `none` returns it unchanged."""
    if mode == "none":
        return forward
    if mode not in ("full", "selective"):
        raise ValueError(f"layer checkpointing {mode!r} is not one of full, selective, none")
    from torch.utils.checkpoint import checkpoint

    options = {"use_reentrant": False}
    if mode == "selective":
        options["context_fn"] = selective_context

    @functools.wraps(forward)
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():  # no backward to recompute for (the reference, the no-grad passes)
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, **options, **kwargs)

    return run
