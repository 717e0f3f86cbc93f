"""The Qwen2.5-7B recipes for 8 x H100: their memory plan passes the learner's own check (learner/execution/memory.py)
and the planner's, and `sr1 plan` runs them on the split they name."""

from __future__ import annotations

import pytest

from config import load_config
from learner.execution.memory import GIB, StepShape, check_micro_batch_fits, step_memory
from sr1.plan.profile import check_memory, engine_memory_gib, gpu_kind, load_profile
from sr1.plan.splits import make_plan

# Qwen2.5-7B's config.json: parameters, hidden, intermediate, layers, heads, KV heads, vocabulary
QWEN_7B = StepShape(7_615_616_512, 3584, 18944, 28, 28, 4, 152_064)
# what the learner's check compares with: the device's total memory, a little under the nominal 80 GB on an H100
H100_BYTES = 79 * GIB
PRESETS = ["search-r1-grpo-7b-8xh100", "qwen2.5-7b-8xh100"]


@pytest.mark.parametrize("preset", PRESETS)
def test_the_7b_memory_plan_fits_an_h100(preset):
    cfg = load_config(preset)
    learner, engine = cfg.learner, cfg.generators.engine
    assert cfg.model.path.startswith("Qwen/Qwen2.5-7B")
    assert cfg.generators.num_engines * engine.tensor_parallel_size + learner.num_ranks == 8
    flags = {"reference": learner.algorithm.needs_reference, "critic": learner.algorithm.needs_critic}
    memory = step_memory(
        QWEN_7B,
        world_size=learner.num_ranks,
        compute_bytes=2,
        checkpointing=learner.gradient_checkpointing,
        cpu_offload=learner.cpu_offload,
        chunk_tokens=learner.logprob_chunk_tokens,
        **flags,
    )
    check_micro_batch_fits(
        memory, learner.micro_batch_tokens, H100_BYTES, "H100", learner.gradient_checkpointing
    )
    profile = load_profile("qwen2.5-7b-h100")
    assert profile.params_billion.value * 1e9 == pytest.approx(QWEN_7B.parameters, rel=1e-3)
    h100 = gpu_kind("h100")
    assert (
        check_memory(
            profile,
            h100,
            ranks=learner.num_ranks,
            tensor_parallel=engine.tensor_parallel_size,
            gpu_memory_utilization=engine.gpu_memory_utilization,
            **flags,
        )
        is None
    )
    # the engine: bf16 weights and the KV cache the profile asks for within its share of the GPU
    assert engine_memory_gib(profile, engine.tensor_parallel_size) <= engine.gpu_memory_utilization * 80


def test_the_planners_activation_figure_is_the_learners_estimate():
    """qwen2.5-7b-h100's activation memory is learner/execution/memory.py's peak less the sharded state, so the two checks
    agree on every split."""
    profile = load_profile("qwen2.5-7b-h100")
    for ranks in (3, 4, 6):
        memory = step_memory(
            QWEN_7B,
            world_size=ranks,
            compute_bytes=2,
            checkpointing=True,
            cpu_offload=False,
            chunk_tokens=1024,
            reference=True,
        )
        state = (16 + 4) * QWEN_7B.parameters / ranks
        assert (memory.peak(16384) - state) / GIB == pytest.approx(
            profile.learner.activation_gib.value, abs=0.1
        )


@pytest.mark.parametrize("preset", PRESETS)
def test_the_7b_presets_plan_on_their_own_split(preset):
    cfg = load_config(preset)
    shrunk = load_config(
        preset,
        ["learner.groups_per_step=16", "learner.ppo_mini_batch_size=16", "generators.max_inflight_groups=8"],
    )
    plan = make_plan(
        shrunk, load_profile("qwen2.5-7b-h100"), gpus=8, kind="h100", bounds=[0, 1], steps=3, warmup=1
    )
    own = cfg.generators.num_engines * cfg.generators.engine.tensor_parallel_size
    rows = [r for r in plan.rows if r.generator_gpus == own]
    assert rows and all(r.excluded is None and r.result.steps_per_hour > 0 for r in rows)
    assert plan.search_r1 is not None and plan.search_r1.step_s > 0
    assert plan.recommended is not None
