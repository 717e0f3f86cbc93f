"""Compiled decoder layers: each layer's forward through torch.compile (inductor), before FSDP2 wraps the layer.

    layer.forward = compiled_forward(layer.forward)     # learner/model.py does this per layer when compile is on
    compile_counters()                                  # {"frames", "graphs", "recompiles", "graph_breaks"}

Only the forward is compiled, not the module call: FSDP2's all-gather and reshard hooks run eagerly around it, and
inside, the layer's RMSNorms, RoPE, SwiGLU and their backward become a few fused kernels instead of dozens of
elementwise launches. The attention runs inside the same graph (FlexAttention's kernel, or the varlen custom ops).
Every layer shares one compiled graph (same code, parameters passed as inputs).

Packed micro-batches change length every time. The row's length is marked dynamic in every input before the
first call, so the first compile is already shape-generic; the attention's own ints (the longest sequence, the BlockMask's length)
go dynamic at their first change. So a run compiles a handful of graphs, not one per micro-batch: the counters
say how many, and the benchmark prints them. The per-sequence SDPA loop takes its boundaries as Python ints,
which a graph would specialise on, so it is never compiled (`resolve_compile`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

from learner.execution.attention import FLEX_BLOCK, VARLEN_SDPA, flex_padded_length

log = logging.getLogger(__name__)


def resolve_compile(setting: bool | str, device: torch.device, attention: str) -> bool:
    """learner.compile: `auto` compiles on CUDA unless the attention is the per-sequence loop; true compiles (and
    refuses the loop, which would recompile for every micro-batch); false does not."""
    if setting == "auto":
        return device.type == "cuda" and attention != VARLEN_SDPA
    if setting and attention == VARLEN_SDPA:
        raise ValueError(
            f"learner.compile: true with attention {VARLEN_SDPA}: the per-sequence loop takes its boundaries as "
            "Python ints, so a compiled layer would recompile for every micro-batch; use compile auto/false, or "
            "another learner.attention"
        )
    return bool(setting)


def compiled_forward(forward: Callable) -> Callable:
    """`forward` (a decoder layer's, possibly checkpointed) compiled by inductor, its packed length dynamic."""
    keep_compilation_records()
    compiled = torch.compile(forward, fullgraph=False, dynamic=None)

    @functools.wraps(forward)
    def run(hidden_states, *args, **kwargs):
        mark_tokens_dynamic(hidden_states.shape[1], hidden_states, args, kwargs)
        return compiled(hidden_states, *args, **kwargs)

    return run


def mark_tokens_dynamic(tokens: int, *inputs) -> None:
    """Mark the dimensions that follow the packed row's length dynamic in every tensor of the inputs: the row itself
    (hidden states, RoPE's cos and sin, the position ids, a mask), FlexAttention's row padded to whole blocks and its
    block counts (the BlockMask's index tensors, its mask's document ids), and the length of 1-D index tensors
    (the varlen kernels' boundaries). One of them left static would pin the length in the graph, and the next
    micro-batch would compile again."""
    from torch.utils._pytree import tree_leaves

    padded = flex_padded_length(tokens)
    for leaf in _tensors(tree_leaves(inputs)):
        index = not leaf.is_floating_point()
        for dim, size in enumerate(leaf.shape):
            if (
                size in (tokens, padded)
                or (index and size == padded // FLEX_BLOCK)
                or (index and leaf.dim() == 1)
            ):
                torch._dynamo.maybe_mark_dynamic(leaf, dim)


def _tensors(leaves):
    """The tensors among pytree leaves, and inside a BlockMask (its index tensors and its mask's closure)."""
    from torch.nn.attention.flex_attention import BlockMask

    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            yield leaf
        elif isinstance(leaf, BlockMask):
            yield from (v for v in vars(leaf).values() if isinstance(v, torch.Tensor))
            cells = getattr(leaf.mask_mod, "__closure__", None) or ()
            yield from (c.cell_contents for c in cells if isinstance(c.cell_contents, torch.Tensor))


# torch keeps a record of the last 64 compilations only; a learner's process makes more (layers, the head's kernels,
# their recompilations), and the recompilation count reads every record
COMPILATION_RECORDS = 100_000


def keep_compilation_records() -> None:
    """Let torch keep a record of every compilation of this process (it keeps the last 64 by default)."""
    import torch._dynamo.utils as dynamo_utils

    setter = getattr(dynamo_utils, "set_compilation_metrics_limit", None)
    if setter is not None and dynamo_utils._compilation_metrics.maxlen != COMPILATION_RECORDS:
        setter(COMPILATION_RECORDS)


def compile_counters() -> dict[str, int]:
    """What torch.compile has done in this process: frames compiled, graphs produced, recompilations (a frame
    compiled again because a guard failed: a new shape regime, a changed constant) and graph breaks."""
    from torch._dynamo.utils import counters

    recompiles = 0
    try:
        from torch._dynamo.utils import get_compilation_metrics

        recompiles = sum(1 for m in get_compilation_metrics() if getattr(m, "recompile_reason", None))
    except ImportError:  # an older torch without compilation metrics
        pass
    return {
        "frames": int(counters["frames"]["ok"]),
        "graphs": int(counters["stats"]["unique_graphs"]),
        "recompiles": recompiles,
        "graph_breaks": int(sum(counters["graph_break"].values())),
    }
