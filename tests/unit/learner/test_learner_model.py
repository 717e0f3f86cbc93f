"""The FSDP2 policy: `learner.cpu_offload` applies CPUOffloadPolicy to every unit and changes no number; the
learner's memory settings are validated."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from fakes.groups import random_groups
from learner.settings import LearnerConfig


def _offload_policies(model: torch.nn.Module) -> set[str]:
    """The offload policy class of every FSDP unit (FSDP2 exposes no public getter; this reads its param groups)."""
    from torch.distributed.fsdp import FSDPModule

    return {
        type(module._get_fsdp_state()._fsdp_param_group.offload_policy).__name__
        for module in model.modules()
        if isinstance(module, FSDPModule)
    }


def test_cpu_offload_gives_the_same_step(world, tiny_model_dir):
    from learner.algorithms.settings import GRPOConfig
    from learner.trainer import Learner

    groups = random_groups(np.random.default_rng(11), n_groups=2, group_size=3, version=0)
    metrics, weights = [], []
    for offload in (False, True):
        # kl_coef > 0: the frozen reference is offloaded too
        cfg = LearnerConfig(
            groups_per_step=2,
            lr=1e-3,
            micro_batch_tokens=128,
            cpu_offload=offload,
            algorithm=GRPOConfig(kl_coef=0.1),
        )
        learner = Learner(cfg, tiny_model_dir, world)
        expected = {"CPUOffloadPolicy"} if offload else {"OffloadPolicy"}
        assert _offload_policies(learner.model) == _offload_policies(learner.reference) == expected
        learner.train_step(groups)
        metrics.append(learner.train_step(groups))  # the second step uses the optimizer state from the first
        assert all(p.device.type == "cpu" for p in learner.model.parameters())
        assert all(s.device.type == "cpu" for st in learner.optimizer.state.values() for s in st.values())
        weights.append({k: v.full_tensor().clone() for k, v in learner.model.state_dict().items()})
    for key in ("loss/pg", "loss/kl_ref", "loss/grad_norm", "loss/entropy"):
        assert metrics[0][key] == pytest.approx(metrics[1][key], rel=1e-6), key
    for name, tensor in weights[0].items():
        torch.testing.assert_close(weights[1][name], tensor, atol=0, rtol=0, msg=name)


def test_memory_settings_are_validated():
    assert LearnerConfig().logprob_chunk_tokens >= 1 and LearnerConfig().cpu_offload is False
    with pytest.raises(ValidationError, match="logprob_chunk_tokens"):
        LearnerConfig(logprob_chunk_tokens=0)
    with pytest.raises(ValidationError, match="cpu_offload"):
        LearnerConfig(cpu_offload="sometimes")
    with pytest.raises(ValidationError, match="cpu_ofload"):  # a typo fails loudly
        LearnerConfig(cpu_ofload=True)


def test_gpu_presets_checkpoint_activations():
    """The 8xH100 presets train with gradient checkpointing: it is what keeps a 16k-token micro-batch of the 3B
    policy within an 80 GB GPU (learner/execution/memory.py)."""
    from config import list_presets, load_config

    gpu_presets = [name for name in list_presets() if "8xh100" in name]
    assert gpu_presets
    for name in gpu_presets:
        cfg = load_config(name)
        assert cfg.learner.gradient_checkpointing and cfg.model.dtype == "bfloat16", name
