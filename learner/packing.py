"""Sequence packing without padding: trajectories become token-budget micro-batches of one packed row each.

A trajectory is prompt + response in one row; the log-prob of response token j comes from the logits at the
position before it. Each packed micro-batch concatenates whole sequences (first-fit decreasing under
`micro_batch_tokens`) and carries, per position t, the target token t + 1 and the loss inputs of that target.

Sequences in a packed row must not attend to each other (learner/execution/attention.py): flash_attention_2 and
sr1_torch_varlen (GPU) and the per-sequence SDPA loop `sr1_varlen_sdpa` get the sequence boundaries
(`cu_seq_lens_q`) and attend within each sequence; `sr1_flex_document` (GPU) gets a document-causal BlockMask built once per micro-batch; plain sdpa/eager
models get an explicit block-diagonal causal mask (`block_causal_mask`). All give the same log-probs as running each
sequence alone (tested). A trajectory longer than `micro_batch_tokens` fits in no micro-batch: the learner
dead-letters its group instead (`untrainable_reason`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from buffer.codec import CodecError, check_token_ids
from buffer.records import Group
from learner.execution.attention import (
    DEVICE_BOUNDARIES,
    FLEX_DOCUMENT,
    VARLEN_SDPA,
    VARLEN_TORCH,
    document_causal_block_mask,
)
from learner.execution.chunked_logprobs import chunked_logprobs
from learner.execution.device import host_to_device
from learner.execution.fused_head import fused_logprobs


@dataclass
class Sequence:
    """One trajectory ready for training: the whole token row plus response-aligned loss inputs."""

    token_ids: np.ndarray  # int64, prompt + response
    prompt_len: int
    loss_mask: np.ndarray  # response-aligned, uint8
    behavior_logprobs: np.ndarray  # response-aligned, float32
    versions: np.ndarray  # response-aligned, int32 (-1 on observation tokens)
    advantage: float

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass
class MicroBatch:
    """One packed row. Per-position tensors have length T = sum(seq_lens); position t holds the target t + 1."""

    input_ids: torch.Tensor  # (1, T) int64
    position_ids: torch.Tensor  # (1, T) int64
    seq_lens: list[int]
    target_ids: torch.Tensor  # (T,) int64 (0 where no target)
    loss_mask: torch.Tensor  # (T,) float32: 1 where the target is a sampled response token
    behavior_logprobs: torch.Tensor  # (T,) float32
    versions: torch.Tensor  # (T,) int64
    advantages: torch.Tensor  # (T,) float32
    keep: torch.Tensor  # (K,) int64: positions whose target is a response token (logits needed there only)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def to(self, device: torch.device) -> MicroBatch:
        """The micro-batch on `device`; to CUDA through pinned memory, without waiting for the copies."""
        return MicroBatch(
            **{
                name: (host_to_device(value, device) if isinstance(value, torch.Tensor) else value)
                for name, value in self.__dict__.items()
            }
        )


def sequences_from_groups(groups: list[Group], advantages: list[np.ndarray]) -> list[Sequence]:
    """Flatten groups into sequences, attaching each trajectory's advantage."""
    sequences = []
    for group, group_adv in zip(groups, advantages, strict=True):
        for trajectory, adv in zip(group.trajectories, group_adv, strict=True):
            sequences.append(
                Sequence(
                    token_ids=np.concatenate([trajectory.prompt_ids, trajectory.response_ids]).astype(
                        np.int64
                    ),
                    prompt_len=len(trajectory.prompt_ids),
                    loss_mask=trajectory.loss_mask,
                    behavior_logprobs=trajectory.behavior_logprobs,
                    versions=trajectory.versions,
                    advantage=float(adv),
                )
            )
    return sequences


def plan_micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """First-fit decreasing bin packing of sequence indices under a token budget (deterministic)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    used: list[int] = []
    for i in order:
        if lengths[i] > budget:
            raise ValueError(
                f"a sequence of {lengths[i]} tokens exceeds learner.micro_batch_tokens ({budget}); "
                "raise micro_batch_tokens to at least model.max_seq_len"
            )
        for b, total in enumerate(used):
            if total + lengths[i] <= budget:
                bins[b].append(i)
                used[b] += lengths[i]
                break
        else:
            bins.append([i])
            used.append(lengths[i])
    return bins


def split_across_ranks(lengths: list[int], world_size: int) -> list[list[int]]:
    """Assign sequences to ranks balancing tokens (longest first onto the least-loaded rank); any number of ranks,
    some possibly empty (learner/minibatches.py says why single trajectories, not groups)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    shares: list[list[int]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for i in order:
        r = min(range(world_size), key=lambda k: (loads[k], k))
        shares[r].append(i)
        loads[r] += lengths[i]
    return [sorted(share) for share in shares]


def pack(sequences: list[Sequence]) -> MicroBatch:
    """Concatenate sequences into one packed row with per-position targets and loss inputs."""
    total = sum(len(s) for s in sequences)
    input_ids = np.zeros(total, dtype=np.int64)
    position_ids = np.zeros(total, dtype=np.int64)
    target_ids = np.zeros(total, dtype=np.int64)
    loss_mask = np.zeros(total, dtype=np.float32)
    has_target = np.zeros(total, dtype=bool)
    behavior = np.zeros(total, dtype=np.float32)
    versions = np.full(total, -1, dtype=np.int64)
    advantages = np.zeros(total, dtype=np.float32)
    offset = 0
    for s in sequences:
        n, p = len(s), s.prompt_len
        input_ids[offset : offset + n] = s.token_ids
        position_ids[offset : offset + n] = np.arange(n)
        # positions p-1 .. n-2 predict the response tokens 0 .. n-p-1
        lo, hi = offset + p - 1, offset + n - 1
        target_ids[lo:hi] = s.token_ids[p:]
        has_target[lo:hi] = True
        loss_mask[lo:hi] = s.loss_mask
        behavior[lo:hi] = s.behavior_logprobs
        versions[lo:hi] = s.versions
        advantages[lo:hi] = s.advantage
        offset += n
    return MicroBatch(
        input_ids=torch.from_numpy(input_ids)[None],
        position_ids=torch.from_numpy(position_ids)[None],
        seq_lens=[len(s) for s in sequences],
        target_ids=torch.from_numpy(target_ids),
        loss_mask=torch.from_numpy(loss_mask),
        behavior_logprobs=torch.from_numpy(behavior),
        versions=torch.from_numpy(versions),
        advantages=torch.from_numpy(advantages),
        keep=torch.from_numpy(np.flatnonzero(has_target)),
    )


def pack_micro_batches(sequences: list[Sequence], budget: int) -> list[MicroBatch]:
    plan = plan_micro_batches([len(s) for s in sequences], budget)
    return [pack([sequences[i] for i in sorted(b)]) for b in plan]


def block_causal_mask(seq_lens: list[int], device: torch.device | None = None) -> torch.Tensor:
    """(1, 1, T, T) boolean mask: True where query i may attend key j (same sequence and j <= i)."""
    seq_id = torch.repeat_interleave(
        torch.arange(len(seq_lens), device=device), torch.tensor(seq_lens, device=device)
    )
    same = seq_id[:, None] == seq_id[None, :]
    causal = torch.ones(len(seq_id), len(seq_id), dtype=torch.bool, device=device).tril()
    return (same & causal)[None, None]


def attention_kwargs(model: torch.nn.Module, mb: MicroBatch) -> dict:
    """How the model keeps the packed sequences apart, built once per micro-batch for all layers: varlen boundaries
    (a host list for the SDPA loop, an int32 device tensor for flash-attention), a document-causal BlockMask
    (FlexAttention), or a (1, 1, T, T) block-causal mask (any other attention)."""
    attn = getattr(model.config, "_attn_implementation", "sdpa")
    device = mb.input_ids.device
    if attn == FLEX_DOCUMENT:
        return {"attention_mask": document_causal_block_mask(mb.seq_lens, device)}
    if attn not in (*DEVICE_BOUNDARIES, VARLEN_SDPA):
        return {"attention_mask": block_causal_mask(mb.seq_lens, device)}
    # varlen kernels: sequence boundaries, no T x T mask (flash-attention takes a 2-D mask as padding: none here)
    bounds = np.cumsum([0, *mb.seq_lens]).tolist()
    longest = max(mb.seq_lens)
    if attn in DEVICE_BOUNDARIES:
        bounds = host_to_device(torch.tensor(bounds, dtype=torch.int32), device)
    return {
        "cu_seq_lens_q": bounds,
        "cu_seq_lens_k": bounds,
        "max_length_q": longest,
        "max_length_k": longest,
    } | (_no_mask(model) if attn == VARLEN_TORCH else {})


def _no_mask(model: torch.nn.Module) -> dict:
    """For torch's varlen kernel: an attention mask per layer type that is already "made" (none), so transformers
    builds none. Otherwise it looks for packed sequences in the position ids with a check that reads a device value
    back to the host, once per forward (flash_attention_2 still pays that read: transformers' flash path wants no
    mask argument at all). Only for models that take such a mapping (those whose config lists `layer_types`: Qwen2,
    Qwen3 and their like)."""
    layer_types = getattr(model.config, "layer_types", None)
    return {"attention_mask": dict.fromkeys(layer_types)} if layer_types else {}


# config attributes of models whose forward changes the logits after the LM head (Gemma 2/3 soft-capping, Cohere,
# Granite): the chunked head below applies the plain LM head only, so it refuses them rather than differ silently
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def lm_head_weight(model: torch.nn.Module) -> torch.Tensor:
    """The LM head's weight as the forward just used it (FSDP2's root unit keeps it unsharded until backward)."""
    from torch.distributed.tensor import DTensor

    for name in _LOGIT_TRANSFORMS:
        if getattr(model.config, name, None) not in (None, 1.0):
            raise ValueError(
                f"{type(model).__name__} transforms its logits after the LM head (config.{name}="
                f"{getattr(model.config, name)}); token_logprobs computes the plain head only"
            )
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError(
            f"{type(model).__name__}'s LM head has a bias; token_logprobs supports bias-free heads"
        )
    if isinstance(head.weight, DTensor):
        raise RuntimeError(
            "the LM head's weight is sharded after the forward: token_logprobs needs it unsharded, as FSDP2 leaves "
            "the root unit's parameters (embeddings, norm, head) between forward and backward; shard the model "
            "with learner.model.load_policy (lm_head in the root unit, root not resharded after forward)"
        )
    return head.weight


def final_hidden_states(model: torch.nn.Module, **inputs) -> torch.Tensor:
    """The decoder's final hidden states ([B, T, H]) from the model's own forward, its LM head run on no position
    (`logits_to_keep` empty): the log-probs come from the chunked head. Taken with a forward hook on
    `get_decoder()`, so under FSDP2 the forward still runs inside the root unit's hooks."""
    captured: list[torch.Tensor] = []
    hook = model.get_decoder().register_forward_hook(
        lambda _module, _args, output: captured.append(output[0])
    )
    try:
        no_position = torch.zeros(0, dtype=torch.long, device=inputs["input_ids"].device)
        model(**inputs, logits_to_keep=no_position, use_cache=False)
    finally:
        hook.remove()
    return captured[-1]


def token_logprobs(
    model: torch.nn.Module,
    mb: MicroBatch,
    temperature: float,
    with_entropy: bool = True,
    chunk_tokens: int = 1024,
    head: str = "chunked",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 log-probs (and entropies) of the targets at `mb.keep`, from logits / temperature like the engine's.

    The model body runs once over the packed row; its final hidden states at the `keep` positions then go through
    the LM head, log-softmax and gather `chunk_tokens` at a time (learner/execution/chunked_logprobs.py), so no
    [tokens x vocab] logits tensor exists in the forward or the backward (`final_hidden_states`). Under FSDP2 this
    still runs inside the root unit's forward/backward hooks, which all-gather the head with the embeddings and
    reduce-scatter its gradient after the backward.
    `with_entropy=False` computes no entropy; with it, the entropy's gradient is computed only if it reaches the loss.
    `head`: `chunked` (learner/execution/chunked_logprobs.py) or `fused` (learner/execution/fused_head.py;
    learner.logprob_head).
    """
    hidden = final_hidden_states(
        model,
        input_ids=mb.input_ids,
        position_ids=mb.position_ids,
        **attention_kwargs(model, mb),
    )[0, mb.keep]
    if head not in ("chunked", "fused"):
        raise ValueError(f"token_logprobs head {head!r} is not one of chunked, fused")
    return (fused_logprobs if head == "fused" else chunked_logprobs)(
        hidden,
        lm_head_weight(model),
        mb.target_ids[mb.keep],
        temperature=temperature,
        chunk_tokens=chunk_tokens,
        with_entropy=with_entropy,
    )


def untrainable_reason(group: Group, micro_batch_tokens: int, vocab_size: int | None = None) -> str | None:
    """Why the learner can never train `group`, or None: a token id outside the model's vocabulary (it would fail as
    an index error inside the embedding), or a trajectory longer than one packed micro-batch, which fits in no
    micro-batch (learner/packing.py) whatever else the batch holds."""
    if vocab_size is not None:
        try:
            check_token_ids(group, vocab_size)
        except CodecError as err:
            return str(err)
    for i, trajectory in enumerate(group.trajectories):
        if trajectory.num_tokens > micro_batch_tokens:
            return (
                f"trajectory {i} has {trajectory.num_tokens} tokens ({len(trajectory.prompt_ids)} prompt + "
                f"{len(trajectory.response_ids)} response), more than learner.micro_batch_tokens "
                f"({micro_batch_tokens})"
            )
    return None
