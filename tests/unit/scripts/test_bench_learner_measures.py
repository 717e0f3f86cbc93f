"""scripts/bench/learner_measures.py: MFU counts the matmul FLOPs a step really does (a LoRA step computes no weight
gradient for its frozen base), and the memory estimate beside the measured peak is the LoRA one for a LoRA learner."""

from __future__ import annotations

import pytest
import torch

from learner.execution import memory
from learner.settings import LearnerConfig
from learner.trainer import Learner
from scripts.bench.learner_measures import (
    Timer,
    estimate_peak_bytes,
    train_flops_per_token,
    trained_parameters,
)

QWEN3B, ADAPTERS = 3_085_938_688, 29_933_568  # Qwen2.5-3B, and rank 16 on every linear layer (docs/lora.md)


def test_a_trained_token_costs_6p_with_full_weights_and_4b_plus_6a_with_lora():
    """Full weights: forward, activations' and weights' gradients, 2P each. LoRA: the same through base and adapters
    but weight gradients for the adapters only: 4B + 6A, the count sr1/plan/lora.py derives a LoRA learner from
    (Qwen2.5-3B at rank 16: 1.48x fewer FLOPs a token than full weights)."""
    assert train_flops_per_token(QWEN3B) == 6 * QWEN3B
    assert train_flops_per_token(QWEN3B + ADAPTERS, ADAPTERS) == 4 * QWEN3B + 6 * ADAPTERS
    assert 6 * QWEN3B / train_flops_per_token(QWEN3B + ADAPTERS, ADAPTERS) == pytest.approx(1.48, abs=0.005)


def test_mfu_is_counted_on_the_trained_flops_and_the_no_gradient_forwards_on_every_parameter():
    timer = Timer(torch.device("cpu"))
    timer(lambda: None, 1000)
    timer.seconds = 2.0  # 500 tokens/s
    base, adapters = 1000, 10
    full = timer.figures("packed", base, 1e9, no_grad_passes=2)
    lora = timer.figures("packed", base + adapters, 1e9, no_grad_passes=2, trained=adapters)
    assert full["packed/tokens_per_s"] == lora["packed/tokens_per_s"] == 500
    assert full["packed/mfu"] == pytest.approx(6 * base * 500 / 1e9)
    assert lora["packed/mfu"] == pytest.approx((4 * base + 6 * adapters) * 500 / 1e9)
    assert lora["packed/mfu_all_passes"] == pytest.approx(
        (4 * base + 6 * adapters + 2 * 2 * (base + adapters)) * 500 / 1e9
    )
    assert "packed/peak_gib" not in lora  # the allocator's peak is CUDA's only


def test_the_estimate_beside_a_lora_learners_peak_is_memorys_lora_estimate(world, tiny_model_dir):
    """The bench's estimate for a LoRA learner: the frozen base in the compute dtype and the adapters' fp32 state,
    no reference copy (learner/execution/memory.py); the full-weight learner's is larger."""
    cfg = LearnerConfig(
        groups_per_step=1,
        micro_batch_tokens=512,
        total_steps=10,
        lora={"rank": 4},
        algorithm={"kl_coef": 0.001},
    )
    lora = Learner(cfg, tiny_model_dir, world)
    everything = sum(p.numel() for p in lora.model.parameters())
    adapters = trained_parameters(lora)
    assert 0 < adapters < everything / 10 and lora.reference is None
    ex = lora.execution
    expected = memory.estimate_peak_bytes(
        lora.model.config,
        everything - adapters,
        world_size=1,
        dtype=lora.model_dtype,
        checkpointing=ex.checkpointing,
        every=ex.checkpointing_every,
        micro_batch_tokens=256,
        chunk_tokens=cfg.logprob_chunk_tokens,
        compiled=ex.compile,
        fused_head=ex.logprob_head == "fused",
        keep_unsharded=ex.keep_unsharded,
        defer_grad_sync=ex.defer_grad_sync,
        lora_parameters=adapters,
    )
    assert estimate_peak_bytes(lora, everything, 256) == pytest.approx(expected)
    full = Learner(cfg.model_copy(update={"lora": None}), tiny_model_dir, world)
    assert trained_parameters(full) == sum(p.numel() for p in full.model.parameters())
    assert estimate_peak_bytes(full, trained_parameters(full), 256) > estimate_peak_bytes(
        lora, everything, 256
    )
