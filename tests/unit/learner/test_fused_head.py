"""The fused log-prob head against today's chunked head (and against full logits): the same log-probs, entropies
and gradients, in fp32 and bf16, eager and compiled; the head the learner picks."""

from __future__ import annotations

import pytest
import torch

from learner.execution.chunked_logprobs import chunked_logprobs
from learner.execution.fused_head import fused_logprobs, resolve_logprob_head


def _inputs(dtype, tokens=300, vocab=1000, hidden=64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=generator).to(dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=generator) * 0.3).to(dtype).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), generator=generator)
    return h, w, targets


def _run(head, h, w, targets, grad_of: str, **kwargs):
    logprobs, entropy = head(h, w, targets, temperature=0.7, chunk_tokens=64, with_entropy=True, **kwargs)
    weights = torch.linspace(-1, 1, logprobs.numel())
    loss = {
        "both": (logprobs * weights).sum() + 0.3 * (entropy * weights.flip(0)).sum(),
        "logprobs": (logprobs * weights).sum(),
        "entropy": entropy.sum(),
    }[grad_of]
    loss.backward()
    grads = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    return logprobs.detach(), entropy.detach(), *grads


@pytest.mark.parametrize("grad_of", ["both", "logprobs", "entropy"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_head_gives_the_chunked_heads_results(dtype, grad_of):
    """Uneven last chunks (300 tokens in chunks of 64) and vocabulary slices (1,000 columns over 300 tokens);
    bf16 gradients within bf16 rounding of the chunked head's (both round fp32 sums once)."""
    h, w, targets = _inputs(dtype)
    expected = _run(chunked_logprobs, h, w, targets, grad_of)
    got = _run(fused_logprobs, h, w, targets, grad_of)
    tight = dtype == torch.float32
    for name, a, b in zip(("log-probs", "entropy", "hidden grad", "weight grad"), got, expected, strict=True):
        tolerance = 1e-5 if tight or name in ("log-probs", "entropy") else 2e-2
        scale = b.abs().max().float().clamp(min=1.0) if name.endswith("grad") else 1.0
        assert (a.float() - b.float()).abs().max() / scale <= tolerance, name


def test_the_fused_head_matches_full_logits_and_skips_unused_gradients():
    h, w, targets = _inputs(torch.float32, tokens=50, vocab=300)
    logprobs, entropy = fused_logprobs(h, w, targets, temperature=1.3, chunk_tokens=16, with_entropy=True)
    log_p = torch.log_softmax((h @ w.T) / 1.3, -1)
    torch.testing.assert_close(logprobs, log_p.gather(-1, targets[:, None])[:, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, -(log_p.exp() * log_p).sum(-1), atol=1e-5, rtol=1e-5)
    # no entropy asked: none computed; a detached entropy and frozen weights get no gradient work
    assert fused_logprobs(h, w, targets, with_entropy=False)[1] is None
    frozen = w.detach()
    logprobs, entropy = fused_logprobs(h, frozen, targets, with_entropy=True)
    logprobs.sum().backward()
    assert h.grad is not None and frozen.grad is None


def test_the_compiled_kernels_give_the_eager_results():
    """The per-chunk kernels through torch.compile (inductor's C++ backend here, Triton on CUDA)."""
    h, w, targets = _inputs(torch.float32, tokens=130, vocab=500)
    expected = _run(fused_logprobs, h, w, targets, "both", compiled=False)
    got = _run(fused_logprobs, h, w, targets, "both", compiled=True)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_bad_inputs_and_the_heads_choice():
    h, w, targets = _inputs(torch.float32, tokens=4, vocab=10)
    with pytest.raises(ValueError, match="one dtype"):
        fused_logprobs(h, w.to(torch.bfloat16), targets)
    with pytest.raises(ValueError, match=r"hidden \[K, H\] and targets \[K\]"):
        fused_logprobs(h[None], w, targets)
    assert resolve_logprob_head("auto", torch.device("cuda")) == "fused"
    assert resolve_logprob_head("auto", torch.device("cpu")) == "chunked"
    assert resolve_logprob_head("fused", torch.device("cpu")) == "fused"
    with pytest.raises(ValueError, match="not one of auto, fused, chunked"):
        resolve_logprob_head("triton", torch.device("cpu"))
