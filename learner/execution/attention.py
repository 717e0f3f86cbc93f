"""Attention for packed rows: each sequence of a packed row attends only to itself, causally, with no T x T mask.

A packed row of T tokens holding sequences of lengths L_1..L_n needs block-diagonal ("document") causal attention.
The learner picks one of four implementations when it loads a model (`attention_implementation`; `auto` on CUDA
times the ones present and takes the fastest, learner/execution/attention_choice.py):

- `flash_attention_2` (CUDA, when flash-attn is installed: the `gpu` extra): flash-attention's varlen kernel gets
  the sequence boundaries (`cu_seq_lens_q/k`, int32 on the device) and the longest length (`max_length_q/k`, an
  int), one kernel call per layer for the whole row; GQA is native.
- `sr1_torch_varlen` (CUDA, where torch has `torch.nn.attention.varlen`): PyTorch's own varlen flash-attention
  kernel (`varlen_attn`), with the same boundaries; no extra package. GQA without copying K/V: `enable_gqa` where
  this torch has it, else K/V with fewer heads go to the kernel as they are (flash-attention's kernel takes them
  natively).
- `sr1_flex_document` (CUDA): FlexAttention (compiled) with a document-causal BlockMask built once per micro-batch
  (`document_causal_block_mask`) and handed to every layer as its `attention_mask`; GQA through `enable_gqa` (K/V
  are not copied per query head). Blocks outside every sequence are skipped, so the cost follows sum(L_i^2), not
  T^2.
- `sr1_varlen_sdpa` (CPU, and the reference the others are tested against): causal SDPA on each sequence's slice, a
  Python loop over sequences. On CPU this is the fastest exact path: SDPA's fused CPU kernel on each slice, where a
  T x T masked SDPA takes the slow math path and FlexAttention has no CPU backward. Its boundaries arrive as a
  Python list, so no layer reads them back from the device; GQA through SDPA's `enable_gqa`.

All four are registered with transformers' attention-function registry (`register()`), so the model's own forward
calls them:

    register()
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attention_implementation(device))
    model(input_ids, position_ids=..., **packing.attention_kwargs(model, mb))   # boundaries or the block mask

Batches with a 2-D padding mask and no boundaries (the padded benchmark) take transformers' own masks: plain SDPA
for the loop's and torch varlen's names, transformers' FlexAttention BlockMask for the flex name.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F

from learner.execution.device import host_to_device

VARLEN_SDPA = "sr1_varlen_sdpa"
FLEX_DOCUMENT = "sr1_flex_document"
FLASH_VARLEN = "flash_attention_2"
VARLEN_TORCH = "sr1_torch_varlen"
IMPLEMENTATIONS = (FLASH_VARLEN, VARLEN_TORCH, FLEX_DOCUMENT, VARLEN_SDPA)
# the kernels that take the boundaries as a device tensor of cumulative lengths
DEVICE_BOUNDARIES = (FLASH_VARLEN, VARLEN_TORCH)


def flash_attn_installed() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def torch_varlen_available() -> bool:
    """Whether this torch has `torch.nn.attention.varlen.varlen_attn` (its kernel runs on CUDA only)."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def attention_implementation(device: torch.device, requested: str = "auto") -> str:
    """The attention a model on `device` uses for packed rows: `requested` if given, else flash-attention's varlen
    kernel on CUDA when installed, FlexAttention on CUDA otherwise, the per-sequence SDPA loop on CPU. (The learner
    resolves `auto` on CUDA by timing the kernels present first: learner/execution/attention_choice.py.)"""
    if requested != "auto":
        if requested not in IMPLEMENTATIONS:
            raise ValueError(f"attention {requested!r} is not one of auto, {', '.join(IMPLEMENTATIONS)}")
        if requested == FLASH_VARLEN and not flash_attn_installed():
            raise ValueError("attention flash_attention_2 needs the flash-attn package (the `gpu` extra)")
        if requested == VARLEN_TORCH and not (torch_varlen_available() and device.type == "cuda"):
            raise ValueError(
                f"attention {VARLEN_TORCH} needs CUDA and a torch with torch.nn.attention.varlen (this is torch "
                f"{torch.__version__} on {device.type})"
            )
    elif device.type == "cuda":
        requested = FLASH_VARLEN if flash_attn_installed() else FLEX_DOCUMENT
    else:
        requested = VARLEN_SDPA
    if requested != FLASH_VARLEN:
        register()
    return requested


# -- the per-sequence SDPA loop (CPU) -------------------------------------------------------------------------------


def varlen_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # (B, Hq, T, D)
    key: torch.Tensor,  # (B, Hkv, T, D)
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    boundaries = kwargs.get("cu_seq_lens_q")
    if boundaries is None:
        return _unpacked_sdpa(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if not isinstance(boundaries, list | tuple):
        raise TypeError(
            f"{VARLEN_SDPA} takes the sequence boundaries as a list of ints (got {type(boundaries).__name__}): a "
            "device tensor would be read back to the host in every layer; see learner.packing.attention_kwargs"
        )
    gqa = (
        query.shape[1] != key.shape[1]
    )  # grouped-query attention: each KV head serves a group of query heads
    dropout = dropout if module.training else 0.0
    parts = [
        F.scaled_dot_product_attention(
            query[:, :, s:e],
            key[:, :, s:e],
            value[:, :, s:e],
            dropout_p=dropout,
            is_causal=True,
            scale=scaling,
            enable_gqa=gqa,
        )
        for s, e in zip(boundaries[:-1], boundaries[1:], strict=True)
    ]
    out = torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]
    return out.transpose(1, 2).contiguous(), None


def _unpacked_sdpa(module, query, key, value, attention_mask, dropout, scaling, **kwargs):
    """An ordinary (padded or single-sequence) batch, without boundaries: transformers' SDPA with its mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)


def _sdpa_mask(*args, attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor | None:
    """No mask for packed rows (boundaries do the work); the usual SDPA mask when a padding mask is given."""
    if attention_mask is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


# -- PyTorch's varlen flash-attention (CUDA) --------------------------------------------------------------------------


@functools.cache
def _varlen_call_options() -> tuple[dict, bool]:
    """How this torch's varlen_attn is asked for causal attention ({window_size: (-1, 0)} from torch 2.11, {is_causal:
    True} before), and whether it takes `enable_gqa` (later versions; earlier ones pass K/V heads through)."""
    import inspect

    from torch.nn.attention.varlen import varlen_attn

    parameters = inspect.signature(varlen_attn).parameters
    # a tuple: varlen_attn tests `window_size == (-1, 0)`, which a list would fail
    causal = {"window_size": (-1, 0)} if "window_size" in parameters else {"is_causal": True}
    return causal, "enable_gqa" in parameters


def torch_varlen_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # (1, Hq, T, D)
    key: torch.Tensor,  # (1, Hkv, T, D)
    value: torch.Tensor,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    boundaries = kwargs.get("cu_seq_lens_q")
    if boundaries is None:
        return _unpacked_sdpa(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if dropout and module.training:
        raise ValueError(f"{VARLEN_TORCH} does not implement attention dropout ({dropout})")
    if query.shape[0] != 1:
        raise ValueError(f"{VARLEN_TORCH} takes one packed row, got a batch of {query.shape[0]}")
    from torch.nn.attention.varlen import varlen_attn

    causal, takes_gqa = _varlen_call_options()
    gqa = {"enable_gqa": True} if takes_gqa and query.shape[1] != key.shape[1] else {}
    longest = kwargs["max_length_q"]
    # (1, H, T, D) -> (T, H, D): a view of the projections' (T, H, D) memory, no copy
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    out = varlen_attn(q, k, v, boundaries, boundaries, longest, longest, scale=scaling, **causal, **gqa)
    return out[None], None


# -- FlexAttention with a document-causal block mask (CUDA) ---------------------------------------------------------


# FlexAttention's block size: a packed row is padded to a whole number of blocks (at least one) before the kernel
FLEX_BLOCK = 128


def flex_padded_length(tokens: int) -> int:
    """The row length FlexAttention runs at: `tokens` rounded up to whole 128-token blocks. Below one block the
    compiler picks its decoding kernel, which failed to compile in training at the Qwen2.5-3B shape (torch 2.11, an
    H200: `NoValidChoicesError`); whole blocks also keep the shapes it compiles for few."""
    return max(1, -(-tokens // FLEX_BLOCK)) * FLEX_BLOCK


def document_causal_block_mask(seq_lens: list[int], device: torch.device):
    """The BlockMask of a packed row: query i sees key j when both lie in the same sequence and j <= i. Built once
    per micro-batch; every layer reuses it (it reaches them as the model's `attention_mask`).

    The mask spans the row padded to whole blocks (`flex_padded_length`); the padding is one more sequence of its
    own, so its queries never meet a real token and no real query sees it. `flex_document_forward` pads q, k and v
    to that length and drops the padding from the output."""
    from torch.nn.attention.flex_attention import create_block_mask

    total = int(sum(seq_lens))
    padded = flex_padded_length(total)
    lengths = [*seq_lens, padded - total]
    # built on the host and copied without a stream sync (a device repeat_interleave would read its size back)
    document = host_to_device(torch.from_numpy(np.repeat(np.arange(len(lengths)), lengths)), device)

    def same_document_causal(_batch, _head, q_index, kv_index):
        return (document[q_index] == document[kv_index]) & (q_index >= kv_index)

    # compiling the mask builder avoids materialising T x T on the GPU; on CPU (forward only) it is not needed
    return create_block_mask(
        same_document_causal, None, None, padded, padded, device=device, _compile=device.type == "cuda"
    )


@functools.cache
def _flex_attention(device_type: str):
    """flex_attention compiled into a fused Triton kernel on CUDA (shapes may vary between micro-batches: the
    compiler marks them dynamic after the first change); the eager reference on CPU (forward only)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention) if device_type == "cuda" else flex_attention


def _flex_eager():
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


def flex_document_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # (B, Hq, T, D)
    key: torch.Tensor,  # (B, Hkv, T, D)
    value: torch.Tensor,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    from torch.nn.attention.flex_attention import BlockMask

    if not isinstance(attention_mask, BlockMask):
        raise TypeError(
            f"{FLEX_DOCUMENT} needs a BlockMask as attention_mask (learner.packing.attention_kwargs builds one per "
            f"micro-batch), got {type(attention_mask).__name__}"
        )
    if dropout and module.training:
        raise ValueError(f"{FLEX_DOCUMENT} does not implement attention dropout ({dropout})")
    tokens = query.shape[2]
    # the packed row's mask spans whole blocks (document_causal_block_mask); transformers' mask of a padded batch not
    pad = attention_mask.seq_lengths[0] - tokens
    if pad < 0:
        raise ValueError(f"the BlockMask spans {attention_mask.seq_lengths[0]} tokens, the row {tokens}")
    if pad:
        query, key, value = (F.pad(t, (0, 0, 0, pad)) for t in (query, key, value))
    # inside a compiled decoder layer (learner/execution/compiled.py) the kernel is compiled with the layer's graph
    attend = _flex_attention(query.device.type) if not torch.compiler.is_compiling() else _flex_eager()
    out = attend(
        query,
        key,
        value,
        block_mask=attention_mask,
        scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out[:, :, :tokens].transpose(1, 2).contiguous(), None


def _flex_mask(*args, **kwargs):
    """transformers' own FlexAttention mask for padded batches (packed rows pass their BlockMask directly)."""
    from transformers.masking_utils import flex_attention_mask

    return flex_attention_mask(*args, **kwargs)


def register() -> None:
    """Register the loop, torch's varlen kernel and the FlexAttention path (and their mask builders) with
    transformers."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN_SDPA, varlen_sdpa_forward)
    AttentionMaskInterface.register(VARLEN_SDPA, _sdpa_mask)
    AttentionInterface.register(FLEX_DOCUMENT, flex_document_forward)
    AttentionMaskInterface.register(FLEX_DOCUMENT, _flex_mask)
    AttentionInterface.register(VARLEN_TORCH, torch_varlen_forward)
    AttentionMaskInterface.register(VARLEN_TORCH, _sdpa_mask)
