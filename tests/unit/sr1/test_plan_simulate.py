"""The simulator of `sr1 plan` against cases with a closed form, and the staleness bound under any workload."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import buffer.admission
import sr1.plan.admission
from sr1.plan.profile import Figure, Profile, load_profile, with_figures
from sr1.plan.simulate import Pipeline, simulate, slowest_rank_tokens

# one engine producing T tokens/s whatever its batch (linear below 1 sequence only), no prefill, fixed lengths
T = 1000.0
LEARNER = 4000.0
PROMPT, TURN = 100, 50
SYNC_S, OVERHEAD_S = 0.2, 0.1


def fixed_profile(**figures: float) -> Profile:
    """The shipped CPU profile with every figure the closed forms need pinned (no variance, no search)."""
    base = load_profile("cpu-tiny").model_copy(deep=True)
    base.generator.tokens_per_s.points = [(1.0, T)]
    pinned = {
        "generator.prefill_cost": 0.0,
        "learner.tokens_per_s_per_rank": LEARNER,
        "learner.scaling_efficiency": 1.0,
        "learner.step_overhead_s": OVERHEAD_S,
        "learner.checkpoint_s": 0.0,
        "workload.prompt_tokens": PROMPT,
        "workload.tokens_per_turn": TURN,
        "workload.tokens_per_turn_cv": 0.0,
        "workload.searches_per_trajectory": 0.0,
        "weight_sync_s": SYNC_S,
        "handoff_s": 0.0,
    }
    return with_figures(base, pinned | figures, source="test")


def pipe(**kw) -> Pipeline:
    shape = dict(engines=1, ranks=1, groups_per_step=4, group_size=4, max_staleness=0, max_turns=2)
    return Pipeline(**(shape | kw))


def test_synchronous_single_engine_matches_the_closed_form():
    # 16 trajectories of 50 tokens share T tokens/s: generation takes 16*50/T; training 16*(100+50)/LEARNER
    result = simulate(pipe(), fixed_profile(), steps=8, warmup=2)
    n = 16
    step = n * TURN / T + n * (PROMPT + TURN) / LEARNER + OVERHEAD_S + SYNC_S
    assert result.step_s == pytest.approx(step, rel=1e-9)
    assert result.steps_per_hour == pytest.approx(3600 / step, rel=1e-9)
    assert result.learner_busy == pytest.approx(1 - (n * TURN / T) / step, rel=1e-9)
    assert result.staleness_histogram == {0: 6 * n * TURN}  # 6 measured steps, every token on-policy


@pytest.mark.parametrize("claim_batch_groups, on_one_engine", [(16, True), (1, False)])
def test_a_release_goes_round_the_engines_a_read_at_a_time(claim_batch_groups, on_one_engine):
    """Two engines, 4 groups of 4 per synchronous step: reads of up to 16 groups leave the whole step on the engine
    that waited longest (its generation takes 16*50/T), reads of one deal it evenly (8*50/T)."""
    result = simulate(
        pipe(engines=2, claim_batch_groups=claim_batch_groups), fixed_profile(), steps=8, warmup=2
    )
    generation = (16 if on_one_engine else 8) * TURN / T
    assert result.step_s == pytest.approx(
        generation + 16 * (PROMPT + TURN) / LEARNER + OVERHEAD_S + SYNC_S, rel=1e-9
    )


def test_the_hand_off_delays_every_synchronous_step():
    without = simulate(pipe(), fixed_profile(), steps=6, warmup=1)
    with_handoff = simulate(pipe(), fixed_profile(handoff_s=0.3), steps=6, warmup=1)
    assert with_handoff.step_s == pytest.approx(without.step_s + 0.3, rel=1e-9)


def test_ppo_epochs_and_ranks_scale_the_training_time():
    result = simulate(pipe(ranks=2, ppo_epochs=3), fixed_profile(), steps=6, warmup=1)
    n = 16
    step = n * TURN / T + 3 * n * (PROMPT + TURN) / (2 * LEARNER) + OVERHEAD_S + SYNC_S
    assert result.step_s == pytest.approx(step, rel=1e-9)


def test_asynchronous_learner_bound_limit_is_the_training_time():
    # generation (16*50/1000 = 0.8 s) is quicker than training + publish (16*150/1000 + 0.3 = 2.7 s)
    profile = fixed_profile(**{"learner.tokens_per_s_per_rank": 1000.0})
    result = simulate(pipe(max_staleness=2), profile, steps=10, warmup=3)
    assert result.step_s == pytest.approx(16 * 150 / 1000 + OVERHEAD_S + SYNC_S, rel=1e-6)
    assert result.learner_busy == pytest.approx(1.0)


def test_asynchronous_generator_bound_limit_is_the_generation_time():
    # a learner 100x faster: a step costs one batch of generation plus the publish's pause of the engine
    profile = fixed_profile(**{"learner.tokens_per_s_per_rank": 400_000.0, "learner.step_overhead_s": 0.0})
    result = simulate(pipe(max_staleness=3), profile, steps=13, warmup=4)  # 12 measured: 3 cycles of 4
    assert result.step_s == pytest.approx(16 * TURN / T + SYNC_S, rel=0.02)
    assert result.generator_busy > 0.95


def test_asynchrony_buys_at_most_the_decoupling_limit():
    profile = fixed_profile()
    sync = simulate(pipe(), profile, steps=10, warmup=3)
    gen = 16 * TURN / T
    train = sync.step_s - gen
    limit = (gen + train) / max(gen, train)
    for bound in (1, 2, 4):
        speedup = simulate(pipe(max_staleness=bound), profile, steps=10, warmup=3).steps_per_hour
        speedup /= sync.steps_per_hour
        assert 1.0 < speedup <= limit + 1e-9


def test_the_admission_and_assembly_are_sr1s_own_code(monkeypatch):
    calls = {"limit": 0, "select": 0}
    real_limit, real_select = buffer.admission.admission_limit, buffer.admission.select_batch
    assert sr1.plan.admission.select_batch is real_select  # the learner's own choice, not a copy

    def limit(*args, **kwargs):
        calls["limit"] += 1
        return real_limit(*args, **kwargs)

    def select(*args, **kwargs):
        calls["select"] += 1
        return real_select(*args, **kwargs)

    monkeypatch.setattr(buffer.admission, "admission_limit", limit)
    monkeypatch.setattr(sr1.plan.admission, "select_batch", select)
    simulate(pipe(max_staleness=1), fixed_profile(), steps=4, warmup=1)
    assert calls["limit"] > 0 and calls["select"] >= 4


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="steps"):
        simulate(pipe(), fixed_profile(), steps=2, warmup=2)
    with pytest.raises(ValueError, match="at least one engine"):
        simulate(pipe(engines=0), fixed_profile())


@settings(max_examples=25, deadline=None)
@given(
    max_staleness=st.integers(0, 3),
    groups_per_step=st.integers(1, 4),
    group_size=st.integers(1, 3),
    engines=st.integers(1, 3),
    searches=st.floats(0.0, 2.0),
    turn_cv=st.floats(0.0, 1.5),
    latency=st.floats(0.001, 2.0),
    learner_rate=st.floats(100.0, 100_000.0),
    dynamic_sampling=st.booleans(),
    seed=st.integers(0, 1_000),
)
def test_staleness_never_exceeds_the_bound(
    max_staleness,
    groups_per_step,
    group_size,
    engines,
    searches,
    turn_cv,
    latency,
    learner_rate,
    dynamic_sampling,
    seed,
):
    profile = fixed_profile(
        **{
            "workload.searches_per_trajectory": searches,
            "workload.tokens_per_turn_cv": turn_cv,
            "workload.search_latency_s": latency,
            "learner.tokens_per_s_per_rank": learner_rate,
            "workload.dropped_group_fraction": 0.3,
        }
    )
    shape = pipe(
        engines=engines,
        groups_per_step=groups_per_step,
        group_size=group_size,
        max_staleness=max_staleness,
        max_inflight_groups=2,
        dynamic_sampling=dynamic_sampling,
    )
    result = simulate(shape, profile, steps=7, warmup=1, seed=seed)
    assert result.staleness_histogram, "no token was trained"
    assert max(result.staleness_histogram) <= max_staleness
    assert min(result.staleness_histogram) >= 0


def test_trajectories_that_do_not_divide_the_ranks_wait_for_the_slowest_rank():
    """3 groups of 4 equal trajectories on 5 ranks: two ranks train 3 trajectories, and the step waits for them."""
    assert slowest_rank_tokens([5, 4, 3, 3, 3], 2, None) == 10  # largest first, each to the least loaded rank
    assert (
        slowest_rank_tokens([5, 4, 3, 3, 3], 2, 2) == 5 + 3 + 3
    )  # each mini-batch waits for its own slowest
    result = simulate(pipe(ranks=5, groups_per_step=3), fixed_profile(), steps=6, warmup=1)
    trajectory = PROMPT + TURN
    assert result.step_s == pytest.approx(
        12 * TURN / T + 3 * trajectory / LEARNER + OVERHEAD_S + SYNC_S, rel=1e-9
    )


def _searching(**figures: float) -> Profile:
    """Every trajectory searches once (max_turns 1), each search 0.1 s alone."""
    return fixed_profile(
        **{
            "workload.searches_per_trajectory": 1.0,
            "workload.search_latency_s": 0.1,
            "workload.search_latency_cv": 0.0,
        }
        | figures
    )


def _with_retrieval(profile: Profile, points: list[tuple[float, float]]) -> Profile:
    return Profile.model_validate(
        profile.model_dump() | {"retrieval": {"requests_per_s": {"points": points, "source": "test"}}}
    )


def test_searches_queue_at_a_saturated_retrieval_server():
    """16 searches at once: a server that answers 10 requests/s whatever the load takes 1.6 s for all of them, 1.5 s
    more than one search alone; a server whose rate grows with its clients (it batches them) adds nothing."""
    shape = pipe(max_turns=1)
    free = simulate(shape, _searching(), steps=6, warmup=1)
    assert free.retrieval_busy is None and free.search_wait_s == 0.0
    naive = simulate(shape, _with_retrieval(_searching(), [(1.0, 10.0)]), steps=6, warmup=1)
    assert naive.step_s == pytest.approx(free.step_s + 1.5, rel=1e-9)
    assert naive.search_wait_s == pytest.approx(1.5, rel=1e-9)  # shared equally, the 16 leave together
    batching = simulate(shape, _with_retrieval(_searching(), [(1.0, 10.0), (64.0, 640.0)]), steps=6, warmup=1)
    assert batching.step_s == pytest.approx(free.step_s, rel=1e-9)
    assert batching.search_wait_s == pytest.approx(0.0, abs=1e-12)
    assert 0 < batching.retrieval_busy < naive.retrieval_busy <= 1.0


def test_an_engine_never_outruns_its_worker():
    """A worker that drives half the engine's tokens/s doubles the generation, and the plan is told."""
    capped = fixed_profile()
    capped.generator.worker_tokens_per_s = Figure(value=T / 2, source="test")
    result = simulate(pipe(), capped, steps=8, warmup=2)
    n = 16
    step = n * TURN / (T / 2) + n * (PROMPT + TURN) / LEARNER + OVERHEAD_S + SYNC_S
    assert result.step_s == pytest.approx(step, rel=1e-9)
    assert result.worker_bound == pytest.approx((n * TURN / (T / 2)) / step, rel=1e-9)
    assert simulate(pipe(), fixed_profile(), steps=8, warmup=2).worker_bound == 0.0
