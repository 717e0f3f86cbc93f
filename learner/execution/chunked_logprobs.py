"""Log-probs (and entropies) of target tokens through the LM head, a chunk of tokens at a time.

    logprobs, entropy = chunked_logprobs(hidden, lm_head.weight, targets, temperature=1.0, chunk_tokens=1024)

`hidden` is the body's final hidden state at the K positions that have a target ([K, H]), `weight` the LM head
([V, H]). The result equals `log_softmax(hidden @ weight.T / temperature)[k, targets[k]]` (and the entropy of that
distribution), but no [K x V] tensor ever exists: at Qwen's 151,936-token vocabulary a 16k-token micro-batch has
~10 GB of fp32 logits per copy, and the unchunked autograd graph keeps several copies. Here the forward keeps only
the per-token log-normaliser, and the backward recomputes each chunk's logits, so both passes hold about two
[chunk_tokens x V] fp32 buffers at a time (one without entropy). The price is one extra LM-head matmul in the
backward (the same trade as activation checkpointing).

Entropy: `with_entropy=False` computes none. With `with_entropy=True` it is computed in the forward (an exp into
a second buffer and two in-place passes per chunk), and its gradient term is computed in the backward only when the
entropy reaches the loss (a detached or unused entropy gets no gradient and costs nothing there).

Gradients: d logprob_t / dz_j = [j = t] - p_j and d H / dz_j = -p_j (log p_j + H), with z = logits / temperature.
"""

from __future__ import annotations

import torch


def _logits_into(
    out: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, temperature: float
) -> torch.Tensor:
    """out = fp32(hidden @ weight.T) / temperature: the model's own head (matmul in the weight's dtype), then the
    trainer's upcast and temperature."""
    if weight.dtype == out.dtype and hidden.dtype == out.dtype:
        torch.matmul(hidden, weight.T, out=out)
    else:
        out.copy_(hidden @ weight.T)
    return out.div_(temperature) if temperature != 1.0 else out


def chunk_entropy(
    shifted: torch.Tensor, exp_shifted: torch.Tensor, sum_exp: torch.Tensor, log_sum: torch.Tensor
) -> torch.Tensor:
    """H = -sum_j p_j log p_j per row, from z - max (`shifted`), its exp and their row sums; overwrites both."""
    log_probs = shifted.sub_(log_sum)
    return exp_shifted.div_(sum_exp).mul_(log_probs).sum(-1).neg_()


def entropy_logit_grad(log_probs: torch.Tensor, probs: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
    """dH/dz = -p * (log p + H), written into `log_probs`' memory."""
    return log_probs.add_(entropy[:, None]).mul_(probs).neg_()


class _ChunkedLogprobs(torch.autograd.Function):
    """Forward and backward loop over chunks of rows. The [chunk x V] work buffers are allocated once per pass and
    reused by every chunk, with in-place ops: on CPU a fresh multi-GB tensor costs its page faults every time."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, chunk_tokens: int, with_entropy: bool):
        num_tokens, vocab = hidden.shape[0], weight.shape[0]
        logprobs = torch.empty(num_tokens, dtype=torch.float32, device=hidden.device)
        log_norm = torch.empty_like(logprobs)
        entropy = torch.empty_like(logprobs) if with_entropy else None
        rows = min(chunk_tokens, num_tokens)
        logits_buffer = logprobs.new_empty(rows, vocab)
        exp_buffer = logprobs.new_empty(rows, vocab) if with_entropy else None
        for start in range(0, num_tokens, chunk_tokens):
            end = min(start + chunk_tokens, num_tokens)
            z = _logits_into(logits_buffer[: end - start], hidden[start:end], weight, temperature)
            target_logit = z.gather(-1, targets[start:end, None])
            row_max = z.amax(-1, keepdim=True)
            shifted = z.sub_(row_max)
            # log-sum-exp as torch.logsumexp computes it (max + log sum exp(z - max)), without its temporary
            if exp_buffer is not None:
                exp_shifted = torch.exp(shifted, out=exp_buffer[: end - start])
                sum_exp = exp_shifted.sum(-1, keepdim=True)
            else:
                sum_exp = shifted.exp_().sum(-1, keepdim=True)
            log_sum = sum_exp.log()
            log_norm[start:end] = (row_max + log_sum)[:, 0]
            logprobs[start:end] = (target_logit - row_max - log_sum)[:, 0]
            if entropy is not None:
                entropy[start:end] = chunk_entropy(shifted, exp_shifted, sum_exp, log_sum)
        del logits_buffer, exp_buffer
        ctx.save_for_backward(hidden, weight, targets, log_norm, entropy)
        ctx.temperature, ctx.chunk_tokens = temperature, chunk_tokens
        # an unused (or detached) entropy then reaches the backward as None: no gradient work for it
        ctx.set_materialize_grads(False)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, targets, log_norm, entropy = ctx.saved_tensors
        temperature, chunk_tokens = ctx.temperature, ctx.chunk_tokens
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if grad_logprobs is None and grad_entropy is None:
            return None, None, None, None, None, None
        num_tokens, vocab = hidden.shape[0], weight.shape[0]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None  # every row is written below
        # low-precision weights: accumulate the chunks' weight gradients in fp32, round once at the end
        grad_weight = None
        if need_weight:
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        rows = min(chunk_tokens, num_tokens)
        logits_buffer = log_norm.new_empty(rows, vocab)
        probs_buffer = log_norm.new_empty(rows, vocab) if grad_entropy is not None else None
        for start in range(0, num_tokens, chunk_tokens):
            end = min(start + chunk_tokens, num_tokens)
            z = _logits_into(logits_buffer[: end - start], hidden[start:end], weight, temperature)
            log_probs = z.sub_(log_norm[start:end, None])
            if grad_entropy is not None:
                probs = torch.exp(log_probs, out=probs_buffer[: end - start])
                grad_z = entropy_logit_grad(log_probs, probs, entropy[start:end]).mul_(
                    grad_entropy[start:end, None]
                )
                if grad_logprobs is not None:
                    grad_z.addcmul_(probs, grad_logprobs[start:end, None], value=-1.0)
            else:
                grad_z = log_probs.exp_().mul_(-grad_logprobs[start:end, None])  # -g * p, in place
            if grad_logprobs is not None:  # + g at the target
                row_index = torch.arange(end - start, device=grad_z.device)
                grad_z.index_put_((row_index, targets[start:end]), grad_logprobs[start:end], accumulate=True)
            if temperature != 1.0:
                grad_z.div_(temperature)
            grad_z = grad_z.to(weight.dtype)
            if need_hidden:
                grad_hidden[start:end] = grad_z @ weight
            if need_weight:
                if grad_weight.dtype == grad_z.dtype:
                    grad_weight.addmm_(grad_z.T, hidden[start:end])
                else:
                    grad_weight += (grad_z.T @ hidden[start:end]).float()
        if need_weight:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 (log-probs [K], entropies [K] or None) of `targets` under softmax(hidden @ weight.T / temperature)."""
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(
            f"chunked_logprobs wants hidden [K, H] and targets [K]; got {tuple(hidden.shape)} and "
            f"{tuple(targets.shape)}"
        )
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    return _ChunkedLogprobs.apply(
        hidden, weight, targets, float(temperature), int(chunk_tokens), with_entropy
    )
