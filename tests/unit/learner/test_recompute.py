"""Activation checkpointing by policy: every policy gives the step of none, and each recomputes what it says
(full: the layers' matmuls again in the backward; selective: only the cheap ops)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from learner.execution.memory import checkpointed_layers
from learner.model import prepare_layers
from learner.packing import pack, token_logprobs
from tests.unit.learner.test_attention import packed_sequences


class _CountOps(TorchDispatchMode):
    """Counts aten calls by packet name (mm, mul, ...)."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _backward_ops(model_dir, policy: str, every: int = 2):
    """Log-probs, gradients and the ops the backward ran, for the tiny model under `policy`."""
    from transformers import AutoModelForCausalLM

    from learner.execution.attention import VARLEN_SDPA, register

    register()
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=VARLEN_SDPA).train()
    prepare_layers(model, policy, every=every)
    mb = pack(packed_sequences(4, [(5, 30), (3, 17), (8, 12)]))
    logprobs, entropy = token_logprobs(model, mb, 0.7)
    with _CountOps() as ops:
        (logprobs.sum() + 0.1 * entropy.sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return logprobs.detach(), grads, ops.counts


def test_every_policy_gives_the_same_gradients_and_recomputes_what_it_says(tiny_model_dir):
    base_logprobs, base_grads, base_ops = _backward_ops(tiny_model_dir, "none")
    ops = {}
    for policy in ("full", "every_n", "selective"):
        logprobs, grads, ops[policy] = _backward_ops(tiny_model_dir, policy, every=2)
        torch.testing.assert_close(logprobs, base_logprobs, atol=0, rtol=0, msg=policy)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, base_grads[name], atol=1e-6, rtol=1e-5, msg=f"{policy}: {name}")
    matmuls = {p: c.get("mm", 0) + c.get("addmm", 0) for p, c in (ops | {"none": base_ops}).items()}
    # the tiny model has 2 layers: full recomputes both, every_n (N = 2) layer 0 only, selective no matmul
    assert matmuls["full"] > matmuls["every_n"] > matmuls["none"] == matmuls["selective"]
    assert ops["selective"].get("mul", 0) > base_ops.get("mul", 0)  # RMSNorm, RoPE, SwiGLU again


def test_which_layers_each_policy_checkpoints():
    assert checkpointed_layers("every_n", 5, 2) == ["full", "none", "full", "none", "full"]
    assert checkpointed_layers("every_n", 3, 1) == ["full"] * 3
    assert checkpointed_layers("selective", 2, 2) == ["selective"] * 2
    with pytest.raises(ValueError, match="not one of none, selective, every_n, full"):
        checkpointed_layers("auto", 2, 2)


def test_no_grad_passes_do_not_checkpoint(tiny_model_dir):
    """The reference's and the no-gradient passes run the plain forward (nothing to recompute for)."""
    from learner.execution.recompute import checkpointed_forward

    calls = []
    forward = checkpointed_forward(lambda x: calls.append(torch.is_grad_enabled()) or (x * x).sin(), "full")
    x = torch.ones(3, requires_grad=True)
    with torch.no_grad():
        forward(x)
    forward(x).sum().backward()
    assert calls == [False, True, True]  # no-grad once; with grad: forward, then the recompute
    assert checkpointed_forward(torch.sin, "none") is torch.sin
