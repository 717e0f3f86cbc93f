"""The "Search-R1 as it runs" baseline of `sr1 plan`: closed forms of its loop, the published step it is calibrated
to, and the fit that calibrates it."""

from __future__ import annotations

import pytest

from config import load_config
from sr1.plan.profile import ProfileError, gpu_kind, load_profile, with_figures
from sr1.plan.search_r1 import batch_seconds, fit_trainer_mfu, search_r1_step
from sr1.plan.simulate import Pipeline
from sr1.plan.splits import make_plan, pipeline

# RLinf's Search-R1 document: Qwen2.5-3B-Instruct in Search-R1's original implementation, 8 x H100, after the response
# length stabilised
PUBLISHED_STEP_S = 133.0
H100 = gpu_kind("h100")
PEAK = H100.peak_tflops * 1e12


def test_a_batch_ends_with_its_last_sequence():
    flat = lambda n: 100.0  # noqa: E731 - 100 tokens/s in all, whatever the batch
    # work-conserving: the engine is never idle while work is left, so the batch takes all its work at 100/s
    assert batch_seconds([10, 20, 30], flat, slots=8) == pytest.approx(0.6)
    assert batch_seconds([10, 20, 30], flat, slots=1) == pytest.approx(0.6)
    # eager mode: no sequence decodes faster than one token per 0.05 s step, so the longest sets the pace
    floored = lambda n: min(100.0, n / 0.05)  # noqa: E731
    assert batch_seconds([10, 20, 30], floored, slots=8) == pytest.approx(30 * 0.05)


def _pinned(**figures: float):
    """The 3B projection with the trajectories pinned: no search, every turn exactly TURN tokens."""
    pinned = {
        "workload.searches_per_trajectory": 0.0,
        "workload.tokens_per_turn": 100.0,
        "workload.tokens_per_turn_cv": 0.0,
        "workload.prompt_tokens": 200.0,
        "generator.prefill_cost": 0.0,
        "search_r1.decode_step_floor_s": 0.0,
    }
    return with_figures(load_profile("qwen2.5-3b-h100"), pinned | figures, source="test")


def test_one_turn_without_searches_matches_the_closed_form():
    profile = _pinned()
    sr = profile.search_r1
    pipe = Pipeline(engines=8, ranks=8, groups_per_step=64, group_size=5, max_staleness=0, max_num_seqs=1024)
    result = search_r1_step(pipe, profile, H100, gpus=8, reference=True, critic=False, steps=2)
    n, params, flops = 320, profile.params_billion.value * 1e9, 8 * PEAK * sr.trainer_mfu.value
    tokens = n * 300
    generation = (
        (n / 8) * 100 / profile.generator.tokens_per_s.at(n // 8)
    )  # 40 sequences of 100 tokens per engine
    expected = {
        "generation": generation,
        "generate calls": sr.generate_call_s.value,
        "per-turn log-probs": 2 * params * tokens / flops,
        "searches": 0.0,
        "old log-probs": 2 * params * tokens / flops,
        "reference": 2 * params * tokens / flops,
        "critic": 0.0,
        "update": 6 * params * tokens / flops,
        "overhead": sr.step_overhead_s.value,
    }
    assert result.phases == pytest.approx(expected, rel=1e-9)
    assert result.generate_calls == 1 and result.step_s == pytest.approx(sum(expected.values()), rel=1e-9)


def test_searches_add_turns_and_go_through_the_retriever_in_one_request_per_turn():
    """Every trajectory searches once (max_turns 1): two generate calls, and the second re-prefills the context."""
    profile = _pinned(**{"workload.searches_per_trajectory": 1.0, "search_r1.run_on_tokens": 0.0})
    pipe = Pipeline(engines=8, ranks=8, groups_per_step=64, group_size=5, max_staleness=0, max_turns=1)
    result = search_r1_step(pipe, profile, H100, gpus=8, reference=False, critic=False, steps=1)
    assert result.generate_calls == 2
    assert result.phases["searches"] == pytest.approx(320 / profile.search_r1.retrieval_queries_per_s.value)
    assert result.phases["reference"] == 0.0
    slow = with_figures(profile, {"search_r1.retrieval_queries_per_s": 1.0}, "a slow index")  # ~1 query/s
    slower = search_r1_step(pipe, slow, H100, gpus=8, reference=False, critic=False, steps=1)
    assert slower.phases["searches"] == pytest.approx(320.0)


def test_the_shipped_profile_reproduces_search_r1s_published_step():
    """The planner, from qwen2.5-3b-h100 as shipped, runs Search-R1's GRPO recipe in 133 s per step (+-15 %), and the
    figure calibrated to it says so."""
    cfg = load_config("search-r1-grpo-8xh100")
    profile = load_profile("qwen2.5-3b-h100")
    pipe = pipeline(cfg, engines=8, ranks=8, max_staleness=0)
    result = search_r1_step(pipe, profile, H100, gpus=8, reference=True, critic=False, steps=3)
    assert result.step_s == pytest.approx(PUBLISHED_STEP_S, rel=0.15)
    assert result.generate_calls == pytest.approx(5, abs=0.5)  # max_turns 4, and a last turn after 4 searches
    fitted = [key for key, figure in profile.search_r1 if figure.source.startswith("fitted")]
    assert fitted == ["trainer_mfu"] and "133" in profile.search_r1.trainer_mfu.source
    others = [figure.source for key, figure in profile.search_r1 if key != "trainer_mfu"]
    assert all(source.startswith("assumption") for source in others)


def test_the_fit_finds_the_mfu_that_gives_the_target_step():
    cfg = load_config(
        "search-r1-grpo-8xh100", ["learner.groups_per_step=32", "learner.ppo_mini_batch_size=32"]
    )
    profile = load_profile("qwen2.5-3b-h100")
    pipe = pipeline(cfg, engines=8, ranks=8, max_staleness=0)
    step = search_r1_step(pipe, profile, H100, gpus=8, reference=True, critic=False, steps=2).step_s
    target = step + 10.0  # a slower trainer
    fitted = fit_trainer_mfu(
        pipe, profile, H100, gpus=8, target_s=target, reference=True, critic=False, steps=2
    )
    assert fitted.search_r1.trainer_mfu.value < profile.search_r1.trainer_mfu.value
    again = search_r1_step(pipe, fitted, H100, gpus=8, reference=True, critic=False, steps=2).step_s
    assert again == pytest.approx(target, rel=2e-3)  # the MFU is rounded to 4 digits
    assert fitted.search_r1.trainer_mfu.source.startswith("fitted")
    with pytest.raises(ProfileError, match="even at an MFU of 1"):
        fit_trainer_mfu(pipe, profile, H100, gpus=8, target_s=1.0, reference=True, critic=False, steps=1)


def test_every_split_of_a_batch_that_divides_nothing_is_planned_against_search_r1():
    """17 groups per step divide none of 2..7 ranks: every split from 1 to 7 generator GPUs runs, each compared
    with Search-R1 as it runs on all 8 GPUs."""
    cfg = load_config(
        "search-r1-grpo-8xh100",
        ["learner.groups_per_step=17", "learner.ppo_mini_batch_size=17", "generators.max_inflight_groups=8"],
    )
    plan = make_plan(cfg, load_profile("qwen2.5-3b-h100"), gpus=8, kind="h100", bounds=[0], steps=3, warmup=1)
    assert [r.generator_gpus for r in plan.rows] == [1, 2, 3, 4, 5, 6, 7]
    assert all(r.excluded is None for r in plan.rows)
    for row in plan.rows:
        assert row.speedup_vs_search_r1 == pytest.approx(
            row.result.steps_per_hour / plan.search_r1.steps_per_hour
        )
    # a profile without Search-R1's figures leaves the baseline out, with the reason
    bare = load_profile("qwen2.5-3b-h100").model_copy(update={"search_r1": None})
    plan = make_plan(cfg, bare, gpus=8, kind="h100", bounds=[0], steps=3, warmup=1)
    assert plan.search_r1 is None and plan.search_r1_excluded == "the profile has no search_r1 figures"
    assert all(r.speedup_vs_search_r1 is None for r in plan.rows)
