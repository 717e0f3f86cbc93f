"""The fused log-prob head: log-probs, log-normalisers and entropies of target tokens through the LM head, with one
compiled pass over each chunk of compute-dtype (bf16) logits and no fp32 [chunk x vocab] tensor.

    logprobs, entropy = fused_logprobs(hidden, weight, targets, temperature=1.0, chunk_tokens=1024, with_entropy=True)

Same contract and results as `learner.execution.chunked_logprobs.chunked_logprobs` (the fallback, used on CPU),
different passes:
- forward, a chunk of tokens at a time: the head's matmul writes the chunk's logits in the compute dtype; one
  compiled kernel (`chunk_statistics`) reads them once, upcasting in registers, and writes three fp32 numbers per
  token: the log-prob of the target, the log-normaliser (log-sum-exp of logits / temperature) and the entropy.
- backward, a slice of the vocabulary at a time (every token, `chunk_tokens x vocab` logits' worth of columns): the
  slice's logits again, then one compiled kernel (`slice_logit_gradient`) writes their gradient in the compute dtype
  from the saved log-normaliser and entropy, d logprob_t / dz_j = [j = t] - p_j and d H / dz_j = -p_j (log p_j + H)
  with z = logits / temperature. The weight's gradient for the slice is then one matmul over all tokens, written
  once (no fp32 [vocab x hidden] accumulator read and written per chunk), and the hidden states' gradient adds up
  in fp32 over the slices ([tokens x hidden], small).
Peak: two compute-dtype [chunk_tokens x vocab] buffers (one in the forward), the fp32 hidden gradient; at Qwen's
151,936-token vocabulary and 1,024-token chunks, 0.6 GB in bf16, about 0.06x the fp32 logits of a 16k-token
micro-batch.

The two kernels are torch.compile'd (inductor: Triton on CUDA, C++ on CPU when asked) with every size dynamic; on
CPU they run as plain torch ops by default, which gives the same numbers through fp32 temporaries (the tests
compare both).
"""

from __future__ import annotations

import functools
import logging

import torch

from learner.execution.compiled import keep_compilation_records

log = logging.getLogger(__name__)

HEADS = ("fused", "chunked")


def resolve_logprob_head(setting: str, device: torch.device) -> str:
    """learner.logprob_head: `auto` is the fused head on CUDA, the chunked one on CPU (where its in-place fp32
    buffers are fastest and no compile is needed)."""
    if setting == "auto":
        return "fused" if device.type == "cuda" else "chunked"
    if setting not in HEADS:
        raise ValueError(f"learner.logprob_head {setting!r} is not one of auto, {', '.join(HEADS)}")
    return setting


def chunk_statistics(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """fp32 (log-prob of the target, log-normaliser, entropy or None) per row of compute-dtype `logits`."""
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    row_max = z.amax(-1, keepdim=True)
    shifted = z - row_max
    exp_shifted = shifted.exp()
    sum_exp = exp_shifted.sum(-1)
    log_sum = sum_exp.log()
    log_norm = row_max[:, 0] + log_sum
    logprob = z.gather(-1, targets[:, None])[:, 0] - log_norm
    entropy = None
    if (
        with_entropy
    ):  # H = log sum exp(z - max) - sum_j p_j (z_j - max): the shifted terms keep it exact near 0
        entropy = log_sum - (exp_shifted * shifted).sum(-1) / sum_exp
    return logprob, log_norm, entropy


def slice_logit_gradient(
    logits: torch.Tensor,
    local_targets: torch.Tensor,
    log_norm: torch.Tensor,
    grad_logprobs: torch.Tensor,
    entropy: torch.Tensor | None,
    grad_entropy: torch.Tensor | None,
    temperature: float,
) -> torch.Tensor:
    """d loss / d logits for a slice of the vocabulary ([tokens x slice], the compute dtype). `local_targets`: each
    token's target index within the slice (outside [0, slice) where the target lies elsewhere)."""
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    log_p = z - log_norm[:, None]
    p = log_p.exp()
    columns = torch.arange(logits.shape[1], device=logits.device)
    is_target = (columns[None, :] == local_targets[:, None]).to(p.dtype)
    grad = (is_target - p) * grad_logprobs[:, None]
    if grad_entropy is not None:
        grad = grad - p * (log_p + entropy[:, None]) * grad_entropy[:, None]
    if temperature != 1.0:
        grad = grad / temperature
    return grad.to(logits.dtype)


@functools.cache
def _kernels(compiled: bool):
    """The two per-chunk functions, compiled with every size symbolic (one graph for all chunk and slice sizes;
    the entropy's presence is the only variant), or as they are."""
    if not compiled:
        return chunk_statistics, slice_logit_gradient

    keep_compilation_records()
    return torch.compile(chunk_statistics, dynamic=True), torch.compile(slice_logit_gradient, dynamic=True)


class _FusedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, hidden, weight, targets, temperature: float, chunk_tokens: int, with_entropy: bool, compiled
    ):
        statistics, _ = _kernels(compiled)
        num_tokens, vocab = hidden.shape[0], weight.shape[0]
        logprobs = torch.empty(num_tokens, dtype=torch.float32, device=hidden.device)
        log_norm = torch.empty_like(logprobs)
        entropy = torch.empty_like(logprobs) if with_entropy else None
        logits_buffer = hidden.new_empty(min(chunk_tokens, num_tokens), vocab)
        for start in range(0, num_tokens, chunk_tokens):
            end = min(start + chunk_tokens, num_tokens)
            logits = torch.matmul(hidden[start:end], weight.T, out=logits_buffer[: end - start])
            lp, ln, h = statistics(logits, targets[start:end], temperature, with_entropy)
            logprobs[start:end], log_norm[start:end] = lp, ln
            if entropy is not None:
                entropy[start:end] = h
        del logits_buffer
        ctx.save_for_backward(hidden, weight, targets, log_norm, entropy)
        ctx.temperature, ctx.chunk_tokens, ctx.compiled = temperature, chunk_tokens, compiled
        ctx.set_materialize_grads(False)  # an unused (or detached) entropy reaches the backward as None
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, targets, log_norm, entropy = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if grad_logprobs is None and grad_entropy is None:
            return None, None, None, None, None, None, None
        _, gradient = _kernels(ctx.compiled)
        num_tokens, vocab = hidden.shape[0], weight.shape[0]
        if grad_logprobs is None:
            grad_logprobs = torch.zeros_like(log_norm)
        grad_hidden = (
            torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_hidden else None
        )
        grad_weight = torch.empty_like(weight) if need_weight else None
        # a slice of the vocabulary holds about as many logits as a chunk of tokens over all of it
        columns = max(1, min(vocab, ctx.chunk_tokens * vocab // max(num_tokens, 1)))
        logits_buffer = hidden.new_empty(num_tokens * columns)
        for start in range(0, vocab, columns):
            end = min(start + columns, vocab)
            out = logits_buffer[: num_tokens * (end - start)].view(num_tokens, end - start)
            logits = torch.matmul(hidden, weight[start:end].T, out=out)
            grad_z = gradient(
                logits, targets - start, log_norm, grad_logprobs, entropy, grad_entropy, ctx.temperature
            )
            if need_hidden and grad_z.dtype == grad_hidden.dtype:
                grad_hidden.addmm_(grad_z, weight[start:end])
            elif need_hidden:
                grad_hidden += (grad_z @ weight[start:end]).float()
            if need_weight:
                torch.matmul(grad_z.T, hidden, out=grad_weight[start:end])
        if need_hidden:
            grad_hidden = grad_hidden.to(hidden.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def fused_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    with_entropy: bool = False,
    compiled: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 (log-probs [K], entropies [K] or None) of `targets` under softmax(hidden @ weight.T / temperature).
    `compiled`: the per-chunk kernels through torch.compile (None: on CUDA, where they fuse into one pass; on CPU
    they run as plain torch ops unless asked)."""
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(
            f"fused_logprobs wants hidden [K, H] and targets [K]; got {tuple(hidden.shape)} and "
            f"{tuple(targets.shape)}"
        )
    if hidden.dtype != weight.dtype:
        raise ValueError(
            f"fused_logprobs wants hidden and weight in one dtype, got {hidden.dtype} and {weight.dtype}"
        )
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if compiled is None:
        compiled = hidden.is_cuda
    return _FusedLogprobs.apply(
        hidden, weight, targets, float(temperature), int(chunk_tokens), with_entropy, bool(compiled)
    )
