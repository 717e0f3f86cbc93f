"""LoRA on the FSDP2 learner (learner/lora.py, one gloo rank): a frozen base, fp32 adapters, PEFT's names on the wire,
the KL reference as the same model with its adapters off, checkpoints of the adapters only, the merged export."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fakes.groups import random_groups
from learner.checkpoints.checkpointer import Checkpointer, ResumeState
from learner.lora import adapters_disabled, lora_layers
from learner.settings import LearnerConfig, LoraSettings
from learner.trainer import Learner

LORA = {"rank": 4, "alpha": 8.0}


def _cfg(**overrides) -> LearnerConfig:
    base = dict(
        groups_per_step=2, lr=1e-2, micro_batch_tokens=512, max_staleness=1, total_steps=10, lora=LORA
    )
    return LearnerConfig(**(base | overrides))


def _groups(seed: int, version: int = 0):
    return random_groups(np.random.default_rng(seed), n_groups=2, group_size=4, version=version)


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def trained(world, tiny_model_dir):
    learner = Learner(_cfg(), tiny_model_dir, world, model_dtype="bfloat16")
    learner.before = _state(learner.model)
    learner.metrics = learner.train_step(_groups(1))
    return learner


def test_settings_refuse_the_head_and_repeated_modules():
    with pytest.raises(ValueError, match=r"may not name \['lm_head'\]"):
        LoraSettings(target_modules=["q_proj", "lm_head"])
    with pytest.raises(ValueError, match="lists a module twice"):
        LoraSettings(target_modules=["q_proj", "q_proj"])
    assert LoraSettings().target_modules == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]


def test_a_target_the_model_lacks_is_named(world, tiny_model_dir):
    with pytest.raises(ValueError, match=r"\['qkv_proj'\] name no linear layer of Qwen2ForCausalLM"):
        Learner(_cfg(lora={"target_modules": ["q_proj", "qkv_proj"]}), tiny_model_dir, world)


def test_the_base_is_frozen_in_the_compute_dtype_and_only_the_adapters_train(trained):
    params = dict(trained.model.named_parameters())
    adapters = {n for n in params if ".lora_" in n}
    assert adapters and all(params[n].requires_grad and params[n].dtype == torch.float32 for n in adapters)
    frozen = set(params) - adapters
    assert all(not params[n].requires_grad and params[n].dtype == torch.bfloat16 for n in frozen)
    # AdamW holds state for the adapters only
    state_params = {id(p) for p in trained.optimizer.state}
    assert state_params == {id(params[n]) for n in adapters}
    after = _state(trained.model)
    changed = {k for k in after if not torch.equal(after[k], trained.before[k])}
    assert changed and all(".lora_B." in k or ".lora_A." in k for k in changed)
    assert any(".lora_B." in k for k in changed)  # B starts at zero and moved
    assert trained.reference is None  # no second copy of the model
    assert np.isfinite(trained.metrics["loss/pg"]) and trained.metrics["loss/grad_norm"] > 0


def test_adapters_disabled_is_the_base_model(world, trained, tiny_model_dir):
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        tuned = trained.model(input_ids=ids).logits.float()
        with adapters_disabled(trained.model):
            base = trained.model(input_ids=ids).logits.float()
    fresh = Learner(_cfg(), tiny_model_dir, world, model_dtype="bfloat16")  # B = 0: the base model
    with torch.no_grad():
        initial = fresh.model(input_ids=ids).logits.float()
    torch.testing.assert_close(base, initial, rtol=0, atol=0)
    assert (tuned - base).abs().max() > 1e-3
    assert not any(layer.disable_adapters for layer in lora_layers(trained.model))  # switched back on


def test_the_wire_carries_peft_names_and_the_adapter_config(trained):
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    names = [name for name, _ in trained.published_weights()]
    reference = get_peft_model(
        AutoModelForCausalLM.from_pretrained(trained.model_path),
        LoraConfig(r=4, lora_alpha=8, target_modules=LoraSettings().target_modules),
    )
    assert names == list(get_peft_model_state_dict(reference))
    extras = trained.publish_extras()
    adapter = extras["adapter"]
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 8 and adapter["peft_type"] == "LORA"
    assert adapter["target_modules"] == LoraSettings().target_modules and adapter["bias"] == "none"
    json.dumps(adapter)  # JSON-able, as the update record needs
    probe = extras["probe"]
    assert len(probe["logprobs"]) == len(probe["token_ids"]) - 1 <= 127
    assert all(x <= 0 for x in probe["logprobs"])


@pytest.mark.parametrize("algorithm", ["grpo", "reinforce_pp", "ppo"])
def test_the_reference_is_the_model_without_its_adapters(world, tiny_model_dir, algorithm):
    """The algorithms that need a KL reference get the base model's log-probs from the LoRA model itself."""
    from learner.packing import pack, sequences_from_groups, token_logprobs

    extra = {"algorithm": {"type": algorithm, "kl_coef": 0.01}}
    if algorithm == "ppo":
        extra["algorithm"]["critic"] = {"lr": 1e-3}
    learner = Learner(_cfg(**extra), tiny_model_dir, world)
    assert learner.algorithm.needs_reference and learner.reference is None
    learner.train_step(_groups(2))
    learner.train_step(_groups(3, version=1))
    mb = pack(sequences_from_groups(_groups(4), [np.zeros(4)] * 2))
    with torch.no_grad():
        ref = learner._reference_logprobs(mb)
    base = Learner(_cfg(lora=None), tiny_model_dir, world)
    with torch.no_grad():
        expected, _ = token_logprobs(base.model, mb, 1.0, with_entropy=False)
    torch.testing.assert_close(ref, expected, rtol=0, atol=1e-5)


def _save(ckpt: Checkpointer, learner: Learner, version: int, export: bool = False):
    state = ResumeState(version=version, cursor=version)
    return ckpt.save(learner.model, learner.optimizer, learner.scheduler, state, export=export)


def _adapters(learner: Learner) -> dict[str, torch.Tensor]:
    return {k: v for k, v in _state(learner.model).items() if ".lora_" in k}


def _moments(learner: Learner) -> dict[str, torch.Tensor]:
    """AdamW's first moment of each parameter that has optimizer state, by parameter name."""
    state = learner.optimizer.state
    return {
        n: state[p]["exp_avg"].full_tensor().clone()
        for n, p in learner.model.named_parameters()
        if p in state
    }


def test_a_checkpoint_holds_the_adapters_and_their_optimizer_state_only(world, tiny_model_dir, tmp_path):
    import os

    from torch.distributed.checkpoint import FileSystemReader

    learner = Learner(_cfg(), tiny_model_dir, world, model_dtype="bfloat16")
    learner.train_step(_groups(5))
    ckpt = Checkpointer(tmp_path / "checkpoints", world, tiny_model_dir, keep=3, lora=learner.cfg.lora)
    good = _save(ckpt, learner, 1)
    expected, moments = _adapters(learner), _moments(learner)
    saved = FileSystemReader(str(good / "resume" / "dcp")).read_metadata().state_dict_metadata
    weights = [k for k in saved if k.startswith("model.")]
    assert weights and all(".lora_" in k for k in weights)  # no base weight in the resume state
    assert {p.name for p in (good / "adapter").iterdir()} == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    assert not (good / "model.safetensors").exists() and not (good / "config.json").exists()
    learner.train_step(_groups(6, version=1))
    torn = _save(ckpt, learner, 2)
    size = (torn / "adapter" / "adapter_model.safetensors").stat().st_size
    os.truncate(torn / "adapter" / "adapter_model.safetensors", size // 2)  # a node died mid-write

    fresh = Learner(_cfg(), tiny_model_dir, world, model_dtype="bfloat16")
    resumed = ckpt.resume(fresh.model, fresh.optimizer, fresh.scheduler)
    assert resumed.path == good and resumed.state.version == 1
    assert resumed.skipped[0][0] == "step_2" and "adapter_model.safetensors has" in resumed.skipped[0][1]
    for name, tensor in _adapters(fresh).items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)
    assert _moments(fresh).keys() == moments.keys() and all(".lora_" in k for k in moments)
    for name, moment in _moments(fresh).items():
        torch.testing.assert_close(moment, moments[name], rtol=0, atol=0)
    # a full-weight run does not resume a LoRA checkpoint, and says why
    full = Learner(_cfg(lora=None), tiny_model_dir, world)
    plain = Checkpointer(tmp_path / "checkpoints", world, tiny_model_dir, keep=3)
    with pytest.raises(ValueError, match="written by a LoRA run and this one trains every weight"):
        plain.load(good, full.model, full.optimizer, full.scheduler)


def test_the_final_checkpoint_exports_the_adapter_and_the_merged_model(world, tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trained = Learner(_cfg(), tiny_model_dir, world)  # an fp32 base: the export adds nothing but the adapter
    trained.train_step(_groups(7))
    ckpt = Checkpointer(tmp_path / "checkpoints", world, tiny_model_dir, lora=trained.cfg.lora)
    path = _save(ckpt, trained, 1, export=True)
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    ids = torch.arange(5, 60)[None]
    merged = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    peft = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), path / "adapter"
    )
    with torch.no_grad():
        merged_lp = torch.log_softmax(merged(input_ids=ids).logits.float(), -1)
        peft_lp = torch.log_softmax(peft(input_ids=ids).logits.float(), -1)
        with peft.disable_adapter():
            base_lp = torch.log_softmax(peft(input_ids=ids).logits.float(), -1)
    torch.testing.assert_close(merged_lp, peft_lp, rtol=0, atol=1e-4)
    assert (merged_lp - base_lp).abs().max() > 1e-3  # the adapter is in there


def test_the_memory_estimate_counts_a_frozen_base_and_the_adapters_state():
    from learner.execution.memory import MemorySettings, StepShape, memory_of
    from learner.lora import lora_parameters

    shape = StepShape(
        parameters=3_085_938_688,
        hidden=2048,
        intermediate=11008,
        layers=36,
        heads=16,
        kv_heads=2,
        vocab=151936,
    )
    adapters = lora_parameters(shape.hidden, shape.kv, shape.intermediate, shape.layers, LoraSettings())
    assert adapters == 29_933_568  # Qwen2.5-3B, rank 16 on every linear layer (PEFT's count)
    full = memory_of(shape, MemorySettings(world_size=8, reference=True))
    lora = memory_of(shape, MemorySettings(world_size=8, lora_parameters=adapters))
    unsharded = 2 * shape.layer_parameters * 2 + shape.vocab * shape.hidden * 2
    assert full.static == pytest.approx((16 + 4) * shape.parameters / 8 + unsharded)
    assert lora.static == pytest.approx((2 * shape.parameters + 16 * adapters) / 8 + unsharded)
    assert lora.head_transient < full.head_transient  # no gradient for the frozen LM head


def test_the_probe_scores_the_last_tokens_of_the_first_trajectory(world, tiny_model_dir):
    from learner.packing import pack, token_logprobs
    from learner.probe import PROBE_TOKENS, probe_sequence

    learner = Learner(_cfg(), tiny_model_dir, world)
    assert learner.publish_extras()["probe"] is None  # version 0: nothing trained, no probe
    groups = _groups(8)
    learner.train_step(groups)
    probe = learner.publish_extras()["probe"]
    first = groups[0].trajectories[0]
    row = np.concatenate([first.prompt_ids, first.response_ids])
    assert probe["token_ids"] == [int(t) for t in row[-PROBE_TOKENS:]]
    mb = pack([probe_sequence(row)])
    with torch.no_grad():
        expected, _ = token_logprobs(learner.model, mb, 1.0, with_entropy=False)
    np.testing.assert_allclose(probe["logprobs"], expected.numpy(), atol=1e-6)
    assert learner.publish_extras()["probe"] is probe  # a publish that repeats the version reuses it
