"""How the learner runs, decided once per device: the CPU choices, named settings kept, the log line; FSDP2's
settings for one rank (parameters kept gathered through an update) change no number and save the copies."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fakes.groups import random_groups
from learner.execution.attention import VARLEN_SDPA
from learner.execution.plan import plan_execution
from learner.settings import LearnerConfig


def test_on_cpu_auto_is_the_loop_eager_layers_the_chunked_head_and_no_checkpointing(world, tiny_model_dir):
    execution = plan_execution(
        LearnerConfig(), tiny_model_dir, world, "float32", reference=False, critic=False
    )
    assert (execution.attention, execution.compile, execution.logprob_head) == (VARLEN_SDPA, False, "chunked")
    assert execution.checkpointing == "none" and execution.memory is None  # no GPU estimate on CPU
    assert execution.keep_unsharded and execution.defer_grad_sync  # one rank
    assert execution.load_options()["reshard_after_forward"] is False
    described = execution.describe()
    assert "attention sr1_varlen_sdpa" in described and "activation checkpointing none" in described


def test_named_settings_are_kept(world, tiny_model_dir):
    cfg = LearnerConfig(
        gradient_checkpointing="every_n", gradient_checkpointing_every=3, logprob_head="fused"
    )
    execution = plan_execution(cfg, tiny_model_dir, world, "float32", reference=True, critic=False)
    assert (execution.checkpointing, execution.checkpointing_every, execution.logprob_head) == (
        "every_n",
        3,
        "fused",
    )
    assert "every 3" in execution.describe()
    with pytest.raises(ValueError, match="recompile for every micro-batch"):
        plan_execution(
            LearnerConfig(compile=True), tiny_model_dir, world, "float32", reference=False, critic=False
        )


def test_checkpointing_settings_keep_todays_meaning():
    assert LearnerConfig(gradient_checkpointing=True).gradient_checkpointing == "full"
    assert LearnerConfig(gradient_checkpointing="false").gradient_checkpointing == "none"
    assert LearnerConfig().gradient_checkpointing == "auto" and LearnerConfig().compile == "auto"
    with pytest.raises(ValueError, match="gradient_checkpointing"):
        LearnerConfig(gradient_checkpointing="sometimes")
    with pytest.raises(ValueError, match="gradient_checkpointing_every"):
        LearnerConfig(gradient_checkpointing_every=0)
    with pytest.raises(ValueError, match="attention"):
        LearnerConfig(attention="flash")


def _step(world, model_dir, keep_unsharded: bool, monkeypatch):
    """Two bf16 steps (two updates of two micro-batches each) with parameters kept gathered or resharded; the
    second step profiled."""
    import learner.trainer as trainer

    plan = trainer.plan_execution
    monkeypatch.setattr(
        trainer,
        "plan_execution",
        lambda *a, **k: dataclasses.replace(plan(*a, **k), keep_unsharded=keep_unsharded),
    )
    cfg = LearnerConfig(groups_per_step=4, lr=1e-3, micro_batch_tokens=160, ppo_mini_batch_size=8)
    learner = trainer.Learner(cfg, model_dir, world, model_dtype="bfloat16")
    learner.train_step(random_groups(np.random.default_rng(0), n_groups=4, group_size=4, version=0))
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as trace:
        metrics = learner.train_step(
            random_groups(np.random.default_rng(1), n_groups=4, group_size=4, version=1)
        )
    copies = sum(e.count for e in trace.key_averages() if e.key == "aten::copy_")
    weights = {k: v.full_tensor().clone() for k, v in learner.model.state_dict().items()}
    return metrics, weights, copies


def test_keeping_parameters_gathered_through_an_update_changes_nothing_but_the_copies(
    world, tiny_model_dir, monkeypatch
):
    """At world size 1 FSDP2's all-gather is a cast and copies: kept gathered from the forward through the last
    backward of an update, each layer is cast once per update instead of two or three times per micro-batch."""
    kept, kept_weights, kept_copies = _step(world, tiny_model_dir, True, monkeypatch)
    resharded, weights, copies = _step(world, tiny_model_dir, False, monkeypatch)
    assert kept["perf/updates"] == 2 and kept["perf/micro_batches"] >= 4
    for key in ("loss/pg", "loss/grad_norm", "loss/entropy"):
        assert kept[key] == resharded[key], key
    for name, tensor in weights.items():
        assert torch.equal(kept_weights[name], tensor), name
    assert kept_copies < 0.85 * copies
