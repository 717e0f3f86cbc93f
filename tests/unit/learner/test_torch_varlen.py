"""sr1_torch_varlen, PyTorch's own varlen kernel for packed rows. Its kernel runs on CUDA only (the GPU tier compares
it with the loop: tests/gpu/test_learner_gpu.py); here the wrapper's side of the contract is checked against a CPU
stand-in that follows varlen_attn's documented API ((T, H, D) tensors, cumulative int32 boundaries, the longest
length, causal by window or flag, K/V heads passed through): the model's log-probs and gradients are the loop's,
K/V are never repeated per query head, and transformers builds no mask for the packed row."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from learner.execution.attention import VARLEN_SDPA, VARLEN_TORCH, attention_implementation, register
from learner.execution.attention_choice import choose_attention, probe_lengths
from learner.packing import attention_kwargs, pack, token_logprobs
from tests.unit.learner.test_attention import packed_sequences


class _ReferenceVarlen:
    """varlen_attn's contract (torch 2.11's: causal by window_size, no enable_gqa) computed with SDPA per sequence;
    records what each call received."""

    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1)):
        return self.attend(
            q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, scale, tuple(window_size) == (-1, 0), None
        )

    def attend(self, q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, scale, causal, gqa):
        self.calls.append({"shapes": (q.shape, k.shape), "causal": causal, "gqa": gqa})
        assert cu_seq_q.dtype == torch.int32 and cu_seq_q is cu_seq_k and isinstance(max_q, int)
        bounds = cu_seq_q.tolist()
        assert max(b - a for a, b in zip(bounds, bounds[1:], strict=False)) == max_q == max_k
        parts = [
            F.scaled_dot_product_attention(
                q[s:e].transpose(0, 1),
                k[s:e].transpose(0, 1),
                v[s:e].transpose(0, 1),
                is_causal=causal,
                scale=scale,
                enable_gqa=q.shape[1] != k.shape[1],
            ).transpose(0, 1)
            for s, e in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        return torch.cat(parts)


class _ReferenceVarlenWithGQA(_ReferenceVarlen):
    """The later contract (torch 2.13's): `enable_gqa` must be set when K/V have fewer heads."""

    def __call__(
        self, q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False
    ):
        assert enable_gqa or q.shape[1] == k.shape[1], "K/V with fewer heads need enable_gqa"
        causal = tuple(window_size) == (-1, 0)
        return self.attend(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, scale, causal, enable_gqa)


def _model(model_dir, attn):
    from transformers import AutoModelForCausalLM

    register()
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=attn).train()


@pytest.fixture(params=[_ReferenceVarlen, _ReferenceVarlenWithGQA])
def stand_in(request, monkeypatch):
    """torch's varlen_attn replaced by a CPU stand-in of one of its two signatures."""
    import torch.nn.attention.varlen as varlen

    from learner.execution.attention import _varlen_call_options

    kernel = request.param()
    monkeypatch.setattr(varlen, "varlen_attn", kernel)
    _varlen_call_options.cache_clear()  # the wrapper reads the kernel's signature once
    yield kernel
    _varlen_call_options.cache_clear()


def test_the_wrapper_gives_the_loops_logprobs_and_gradients(tiny_model_dir, stand_in):
    reference = stand_in
    mb = pack(packed_sequences(5, [(7, 40), (3, 20), (9, 33)]))
    results = {}
    for attn in (VARLEN_SDPA, VARLEN_TORCH):
        model = _model(tiny_model_dir, attn)
        kwargs = attention_kwargs(model, mb)
        logprobs, entropy = token_logprobs(model, mb, 0.7)
        (logprobs.sum() + 0.1 * entropy.sum()).backward()
        results[attn] = logprobs.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}
    assert kwargs["attention_mask"] == {"full_attention": None}  # no mask built, no packed-sequence check
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    assert len(reference.calls) == config.num_hidden_layers and all(c["causal"] for c in reference.calls)
    q_shape, k_shape = reference.calls[0]["shapes"]
    assert (q_shape[1], k_shape[1]) == (
        heads,
        kv_heads,
    )  # K/V reach the kernel with their own heads, not copied
    assert reference.calls[0]["gqa"] is (True if isinstance(reference, _ReferenceVarlenWithGQA) else None)
    loop_logprobs, loop_grads = results[VARLEN_SDPA]
    logprobs, grads = results[VARLEN_TORCH]
    torch.testing.assert_close(logprobs, loop_logprobs, atol=1e-5, rtol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, loop_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_torch_varlen_is_refused_where_its_kernel_cannot_run():
    with pytest.raises(ValueError, match="sr1_torch_varlen needs CUDA"):
        attention_implementation(torch.device("cpu"), VARLEN_TORCH)


def test_auto_on_cpu_is_the_loop_unmeasured_and_the_probe_row_is_search_shaped():
    name, seconds = choose_attention(
        torch.device("cpu"), "auto", heads=4, kv_heads=2, head_dim=16, dtype=torch.float32, tokens=4096
    )
    assert (name, seconds) == (VARLEN_SDPA, {})
    lengths = probe_lengths(16384)
    assert sum(lengths) == 16384 and all(0 < n <= 4096 for n in lengths)
    assert 800 < sum(lengths[:-1]) / len(lengths[:-1]) < 2000  # about Search-R1's 1,350 tokens a trajectory
    assert probe_lengths(16384) == lengths  # the same row every time
