"""`sr1 plan` with `learner.lora`: the adapter's size against PEFT's own, the LoRA learner's memory, FLOPs and bytes
derived from the full-weight profile, engines that never pause for an update, and the layout where an engine and a
learner rank share each GPU (planned over gloo, refused with the reason otherwise)."""

from __future__ import annotations

import json

import pytest
import torch

from config import list_presets, load_config
from learner.execution.memory import GIB
from sr1.plan.figures import Figure, ModelShape
from sr1.plan.lora import LORA_TARGETS, adapter_parameters, lora_profile
from sr1.plan.profile import (
    ProfileError,
    check_memory,
    engine_memory_gib,
    gpu_kind,
    learner_memory_gib,
    load_profile,
    with_figures,
)
from sr1.plan.simulate import simulate
from sr1.plan.splits import make_plan, pipeline

H100 = gpu_kind("h100")
SHRINK = ["learner.groups_per_step=16", "learner.ppo_mini_batch_size=16", "generators.max_inflight_groups=8"]
SHARED = ["weight_sync.backend=gloo", "generators.use_ray=false", "learner.use_ray=false"]
LORA_PRESETS = sorted(p for p in list_presets() if "lora" in p and "xh100" in p)


def _derive(name: str, policy: str = "auto", share: float = 1.0):
    cfg = load_config("search-r1-grpo-lora-8xh100")
    return lora_profile(
        load_profile(name),
        cfg.learner.lora,
        tokens=16384,
        chunk_tokens=1024,
        policy=policy,
        kind=H100,
        max_loras=3,
        learner_share=share,
    )


@pytest.mark.parametrize("profile", ["qwen2.5-3b-h100", "qwen2.5-7b-h100"])
def test_adapter_parameters_are_what_peft_makes(profile):
    """Two decoder layers of the model's shape on the meta device: PEFT's adapter state dict (what the learner
    publishes) has exactly the planner's parameter count, for every linear layer and for attention only."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = load_profile(profile).shape
    two = ModelShape(**(shape.model_dump() | {"layers": 2}))
    config = Qwen2Config(
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=2,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        vocab_size=64,
    )
    for targets in (list(LORA_TARGETS), ["q_proj", "v_proj"]):
        with torch.device("meta"):
            model = get_peft_model(
                Qwen2ForCausalLM(config), LoraConfig(r=16, lora_alpha=32, target_modules=targets)
            )
        published = sum(t.numel() for t in get_peft_model_state_dict(model).values())
        assert adapter_parameters(two, 16, targets) == published


def test_adapter_bytes_per_update_are_about_one_percent_of_the_weights():
    """Rank 16 on every linear layer: 29.9M parameters for Qwen2.5-3B (0.97 % of its weights), 40.4M for 7B
    (0.53 %); the publish time scales with the bytes, and the engines never pause."""
    for name, adapters, share in (
        ("qwen2.5-3b-h100", 29_933_568, 0.0097),
        ("qwen2.5-7b-h100", 40_370_176, 0.0053),
    ):
        full, lora = load_profile(name), _derive(name)
        assert adapter_parameters(full.shape, 16, LORA_TARGETS) == adapters
        params = full.params_billion.value * 1e9
        assert adapters / params == pytest.approx(share, abs=5e-4)
        assert lora.weight_sync_s.value == pytest.approx(full.weight_sync_s.value * adapters / params)
        assert lora.engine_pause_s.value == 0 and full.engine_pause_s is None
        assert lora.weight_sync_s.source.startswith("derived")


def test_the_lora_learner_memory_holds_a_bf16_base_and_fp32_adapters():
    """Per rank: 2 bytes per base parameter and 16 per adapter parameter, sharded; the KL reference costs nothing
    (the base with the adapters off); activations from learner/execution/memory.py at the least recompute that fits."""
    full, lora = load_profile("qwen2.5-3b-h100"), _derive("qwen2.5-3b-h100")
    params, adapters = full.params_billion.value * 1e9, 29_933_568
    for ranks in (1, 6):
        state = (2 * params + 16 * adapters) / ranks / GIB
        got = learner_memory_gib(lora, ranks, reference=True, critic=False)
        assert got == pytest.approx(state + lora.learner.activation_gib.value, rel=1e-6)
    # the full-weight learner needs 16 + 4 (reference) bytes per parameter: 61 GiB on one rank, more than an H100
    # leaves beside an engine at 0.35 of it; LoRA's fits there
    assert learner_memory_gib(full, 1, reference=True, critic=False) > 0.65 * 80
    assert (
        learner_memory_gib(_derive("qwen2.5-3b-h100", share=0.65), 1, reference=True, critic=False)
        <= 0.65 * 80
    )
    assert learner_memory_gib(lora, 1, reference=True, critic=False) <= 0.9 * 80
    assert (
        "recompute 'selective'" in lora.learner.activation_gib.source
    )  # `none` would need ~72 GiB of activations
    # half the GPU (a shared one) leaves room only with more recompute
    assert "recompute 'full'" in _derive("qwen2.5-7b-h100", share=0.42).learner.activation_gib.source
    assert (
        check_memory(
            lora, H100, ranks=1, tensor_parallel=1, gpu_memory_utilization=0.85, reference=True, critic=False
        )
        is None
    )
    # the engine keeps max_loras adapter slots beside its weights and KV cache
    assert engine_memory_gib(lora, 1) - engine_memory_gib(full, 1) == pytest.approx(3 * 2 * adapters / GIB)


def test_the_lora_learner_tokens_per_s_follow_the_flops():
    """The full-weight figure was measured with full gradient checkpointing (8P FLOPs a token); a LoRA step without
    matmul recompute does 4P + 6A: about 1.97x the tokens/s for 3B. With full recompute (6P + 8A), 1.32x."""
    full = load_profile("qwen2.5-3b-h100")
    params, adapters = full.params_billion.value * 1e9, 29_933_568
    tps = full.learner.tokens_per_s_per_rank.value
    assert _derive("qwen2.5-3b-h100").learner.tokens_per_s_per_rank.value == pytest.approx(
        tps * 8 * params / (4 * params + 6 * adapters)
    )
    assert _derive("qwen2.5-3b-h100", policy="full").learner.tokens_per_s_per_rank.value == pytest.approx(
        tps * 8 * params / (6 * params + 8 * adapters)
    )
    # a profile that does not say how its figure was measured is taken as no recompute: 6P against 4P + 6A
    unstated = load_profile("qwen2.5-3b-h100").model_copy(deep=True)
    unstated.learner.recomputed_forwards = None
    derived = lora_profile(
        unstated,
        load_config("search-r1-grpo-lora-8xh100").learner.lora,
        tokens=16384,
        chunk_tokens=1024,
        policy="none",
        kind=gpu_kind("cpu"),
        max_loras=3,
    )
    assert derived.learner.tokens_per_s_per_rank.value == pytest.approx(
        tps * 6 * params / (4 * params + 6 * adapters)
    )


def test_an_engine_loading_an_adapter_keeps_decoding():
    """The same publish time, with the engines paused through it (full weights) or not at all (a LoRA adapter): a
    pipeline the generator pool bounds runs faster without the pause."""
    cfg = load_config("tiny")
    # a fast learner: the generator pool bounds the pipeline, and a pause costs it
    fast = {"weight_sync_s": 0.5, "learner.tokens_per_s_per_rank": 1e7}
    profile = with_figures(load_profile("cpu-tiny"), fast)
    pipe = pipeline(cfg, engines=1, ranks=1, max_staleness=1)
    paused = simulate(pipe, profile, steps=6, warmup=2)
    no_pause = profile.model_copy(update={"engine_pause_s": Figure(value=0.0, source="a LoRA adapter")})
    free = simulate(pipe, no_pause, steps=6, warmup=2)
    assert free.steps_per_hour > 1.1 * paused.steps_per_hour


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ([], "NCCL refuses two ranks of one communicator on the same GPU"),
        (["weight_sync.backend=gloo"], "Ray gives every engine and every learner rank a whole GPU"),
        (
            [*SHARED, "generators.engine.gpu_memory_utilization=0.2"],
            "the engine needs 25.9 GiB, more than its share",
        ),
        (
            [*SHARED, "generators.engine.gpu_memory_utilization=0.9"],
            "more than the 8.0 GiB the engine's share",
        ),
    ],
)
def test_the_shared_layout_is_refused_with_its_reason(overrides, reason):
    cfg = load_config("search-r1-grpo-lora-8xh100", [*SHRINK, *overrides])
    plan = make_plan(cfg, load_profile("qwen2.5-3b-h100"), gpus=2, kind="h100", bounds=[0], steps=3, warmup=1)
    assert reason in plan.shared_excluded
    assert not any(r.shared for r in plan.rows)


def test_one_h100_plans_the_shared_layout_over_gloo():
    """One GPU: the engine at its memory share and the learner rank beside it, asynchronous; each slows the other
    while both work, and the update costs the engine no pause."""
    cfg = load_config("search-r1-grpo-lora-1xh100")  # Search-R1's whole step: 512 groups of 5
    assert cfg.weight_sync.backend == "gloo"
    plan = make_plan(
        cfg, load_profile("qwen2.5-3b-h100"), gpus=1, kind="h100", bounds=[0, 1], steps=5, warmup=1
    )
    assert plan.shared_excluded is None
    rows = {r.max_staleness: r for r in plan.rows}
    assert all(r.shared and r.result.steps_per_hour > 0 for r in rows.values())
    # time-slicing conserves work: beside a decoding engine the learner's step takes at least as long as alone (at
    # bound 0 the engine is idle while it trains), and an engine at half speed a step more
    assert rows[1].result.train_s >= 0.99 * rows[0].result.train_s
    assert plan.recommended is not None and plan.recommended.shared
    assert plan.lora["adapter_bytes"] == 2 * 29_933_568
    # the full-weight learner cannot share the GPU: 16 bytes per parameter and the reference's fp32 copy
    full = make_plan(
        load_config(
            "search-r1-grpo-8xh100", [*SHRINK, *SHARED, "generators.engine.gpu_memory_utilization=0.35"]
        ),
        load_profile("qwen2.5-3b-h100"),
        gpus=1,
        kind="h100",
        bounds=[0],
        steps=3,
        warmup=1,
    )
    assert "the learner rank needs" in full.shared_excluded and full.recommended is None


@pytest.mark.parametrize("preset", LORA_PRESETS)
def test_the_lora_presets_fit_their_own_layout(preset):
    """Every Search-R1 LoRA preset on its own GPUs: the split its name says, memory that fits the H100 for both pools
    (the derived LoRA figures), and the 1-GPU ones sharing their GPU over gloo."""
    cfg = load_config(preset, SHRINK)
    gpus = int(preset.rsplit("-", 1)[1].removesuffix("xh100"))
    name = "qwen2.5-7b-h100" if "-7b-" in preset else "qwen2.5-3b-h100"
    assert cfg.learner.lora is not None and cfg.learner.lora.rank == 16
    engines, ranks = cfg.generators.num_engines, cfg.learner.num_ranks
    plan = make_plan(
        cfg, load_profile(name), gpus=gpus, kind="h100", bounds=[cfg.learner.max_staleness], steps=3
    )
    shared = engines == ranks == gpus
    if shared:
        assert plan.shared_excluded is None and cfg.weight_sync.backend == "gloo"
    else:
        assert engines + ranks == gpus
    rows = [r for r in plan.rows if r.shared == shared and r.generator_gpus == engines]
    assert rows and all(r.excluded is None and r.result.steps_per_hour > 0 for r in rows)


def test_a_lora_learners_own_figures_are_not_derived_again():
    """A profile measured from a LoRA run (or derived already) is a LoRA learner's: a LoRA config plans with it as it
    is, and a full-weight config refuses it, naming why."""
    measured = load_profile("qwen2.5-3b-h100").model_copy(update={"lora": "rank 16 on q_proj, v_proj"})
    plan = make_plan(
        load_config("search-r1-grpo-lora-8xh100", SHRINK), measured, gpus=2, kind="h100", bounds=[0], steps=3
    )
    assert plan.profile.learner.tokens_per_s_per_rank.value == measured.learner.tokens_per_s_per_rank.value
    with pytest.raises(ProfileError, match="holds a LoRA learner's figures .* trains every weight"):
        make_plan(
            load_config("search-r1-grpo-8xh100", SHRINK), measured, gpus=2, kind="h100", bounds=[0], steps=3
        )


def test_the_adapter_travels_in_the_models_dtype():
    """The tiny model runs in fp32 on CPU: its rank-16 adapter is 65,536 parameters of 4 bytes (10.6 % of its
    620,928 parameters), as its full weights are sent at 4 bytes."""
    cfg = load_config("tiny", ["learner.lora.rank=16"])
    assert cfg.model.dtype == "float32"
    plan = make_plan(cfg, load_profile("cpu-tiny"), gpus=2, kind="cpu", bounds=[0], steps=3)
    assert plan.lora["adapter_bytes"] == 4 * 65_536 and plan.lora["full_bytes"] == 4 * 620_928
    assert plan.profile.weight_sync_s.value == pytest.approx(0.045 * 65_536 / 620_928)


@pytest.mark.parametrize("profile", ["qwen2.5-3b-h100", "qwen2.5-7b-h100"])
def test_the_planners_lora_memory_is_the_learners_own_estimate(profile):
    """On every split the planner's LoRA memory per rank is learner/execution/memory.py's peak for the same step (the policy
    it chose, the adapters trained, the reference the base itself), so the two checks agree."""
    from learner.execution.memory import MemorySettings, memory_of
    from sr1.plan.lora import step_shape

    full, lora = load_profile(profile), _derive(profile)
    policy = lora.learner.activation_gib.source.split("recompute '")[1].split("'")[0]
    adapters = adapter_parameters(full.shape, 16, LORA_TARGETS)
    for ranks in (1, 3, 6):
        settings = MemorySettings(
            world_size=ranks, tokens=16384, checkpointing=policy, lora_parameters=adapters
        )
        own = memory_of(step_shape(full), settings).peak(16384) / GIB
        assert learner_memory_gib(lora, ranks, reference=True, critic=False) == pytest.approx(own, rel=1e-6)


def test_sr1_plan_prints_the_adapter_the_pause_and_the_shared_layout(capsys, tmp_path):
    """`sr1 plan` on the 1-GPU LoRA preset: the shared layout's rows, the adapter against the full weights, no engine
    pause, the derived figures' sources; --json carries the same, and --png draws the shared points."""
    from sr1.cli import main as sr1_main

    argv = ["plan", "search-r1-grpo-lora-1xh100", *SHRINK, "--gpus", "1", "--gpu-kind", "h100"]
    argv += ["--profile", "qwen2.5-3b-h100", "--bounds", "0,1", "--steps", "3", "--warmup", "1"]
    assert sr1_main([*argv, "--png", str(tmp_path / "plan.png")]) == 0
    out = capsys.readouterr().out
    assert "1 shared (engine + rank each) *" in out
    assert "LoRA: 29.9M adapter parameters (0.97% of the model); 59.9 MB per update against 6.18 GB" in out
    assert "engine pause per update 0 s (full weights: 2.0 s)" in out
    assert "learner.tokens_per_s_per_rank = 23120" in out and "derived, not measured" in out
    assert (tmp_path / "plan.png").stat().st_size > 0
    assert sr1_main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["lora"]["engine_pause_s"] == 0 and data["lora"]["full_weight_engine_pause_s"] == 2.0
    assert data["shared_excluded"] is None and all(r["shared"] for r in data["rows"])
    assert data["profile"]["engine_pause_s"]["value"] == 0


def test_a_profile_the_lora_figures_cannot_be_derived_from_is_named():
    """No model shape, no LoRA decode speed, a target module the planner does not know: each a ProfileError that
    says what is missing."""
    cfg = load_config("search-r1-grpo-lora-8xh100", SHRINK)
    full = load_profile("qwen2.5-3b-h100")
    plan = {"gpus": 8, "kind": "h100", "bounds": [0], "steps": 3}
    with pytest.raises(ProfileError, match="has no `shape` section .* the LoRA figures are derived from it"):
        make_plan(cfg, full.model_copy(update={"shape": None}), **plan)
    no_speed = full.model_copy(
        update={"generator": full.generator.model_copy(update={"lora_decode_speed": None})}
    )
    with pytest.raises(ProfileError, match="has no generator.lora_decode_speed"):
        make_plan(cfg, no_speed, **plan)
    odd = load_config("search-r1-grpo-lora-8xh100", [*SHRINK, "learner.lora.target_modules=[q_proj,w_in]"])
    with pytest.raises(ProfileError, match=r"knows no linear layer \['w_in'\]"):
        make_plan(odd, full, **plan)
