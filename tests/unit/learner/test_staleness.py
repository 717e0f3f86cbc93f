"""The off-policy diagnostics (importance-weight ESS, the bound in force) and `learner.max_staleness: auto`'s
controller, against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from buffer.auto_staleness import StalenessAutoConfig, StalenessController
from buffer.staleness import (
    StalenessError,
    StepBounds,
    check_staleness,
    first_bound,
    is_auto,
    largest_bound,
)
from fakes.groups import random_groups
from learner.algorithms.corrections import effective_sample_size


def test_ess_by_hand():
    # weights 1, 1, 1, 1: every sample counts
    assert effective_sample_size(4.0, 4.0, 4) == pytest.approx(1.0)
    # weights 2, 0, 0, 0: (2)^2 / (4 * 4) = 1/4, one sample of four carries everything
    assert effective_sample_size(2.0, 4.0, 4) == pytest.approx(0.25)
    # weights 1, 3: (4)^2 / (2 * 10) = 0.8
    assert effective_sample_size(4.0, 10.0, 2) == pytest.approx(0.8)
    assert effective_sample_size(0.0, 0.0, 0) == 1.0  # no tokens: nothing to say


def test_offpolicy_stats_by_hand():
    """k3 KL(mu || pi_0) and the raw weights pi_0 / mu per token; nothing counted without pi_0's log-probs."""
    from learner.algorithms.corrections import offpolicy_stats

    start = torch.log(torch.tensor([0.5, 0.2, 0.9, 0.4]))
    behavior = torch.log(torch.tensor([0.5, 0.4, 0.3, 0.4]))  # weights 1, 0.5, 3, 1
    stats = offpolicy_stats(start, behavior)
    weights = np.array([1.0, 0.5, 3.0, 1.0])
    np.testing.assert_allclose(stats["start_weight"].numpy(), weights, rtol=1e-6)
    np.testing.assert_allclose(
        stats["start_kl"].numpy(), weights - 1 - np.log(weights), rtol=1e-6, atol=1e-12
    )
    ess = effective_sample_size(float(stats["start_weight"].sum()), float(stats["start_weight_sq"].sum()), 4)
    assert ess == pytest.approx(weights.sum() ** 2 / (4 * np.square(weights).sum()))
    assert float(stats["start_tokens"].sum()) == 4
    assert all(float(v.abs().sum()) == 0 for v in offpolicy_stats(None, behavior).values())


def test_offpolicy_figures_leave_out_the_steps_own_updates(world, tiny_model_dir):
    """One update per step, or four (2 mini-batches x 2 epochs at a high learning rate): `loss/offpolicy_kl` and
    `loss/is_ess` measure the behaviour against the step's starting weights in both (the same figures), while
    `loss/mismatch_kl` also sees how far the step's own updates moved the policy."""
    from learner.settings import LearnerConfig
    from learner.trainer import Learner

    figures = []
    for several in (False, True):
        extra = {"ppo_mini_batch_size": 3, "ppo_epochs": 2} if several else {}
        cfg = LearnerConfig(groups_per_step=2, micro_batch_tokens=512, lr=1e-2, correction="tis", **extra)
        learner = Learner(cfg, tiny_model_dir, world)
        groups = random_groups(np.random.default_rng(3), n_groups=2, group_size=3, version=0)
        metrics = learner.train_step(groups, StepBounds(5, {0: 4}))
        assert metrics["perf/updates"] == (4 if several else 1) and metrics["staleness/bound"] == 5
        figures.append(metrics)
    one, four = figures
    assert one["loss/offpolicy_kl"] == pytest.approx(one["loss/mismatch_kl"], rel=1e-6)
    assert four["loss/offpolicy_kl"] == pytest.approx(one["loss/offpolicy_kl"], rel=1e-3)
    assert four["loss/is_ess"] == pytest.approx(one["loss/is_ess"], rel=1e-3)
    assert abs(four["loss/mismatch_kl"] - four["loss/offpolicy_kl"]) > 1e-3 * four["loss/offpolicy_kl"]
    # the fake behaviour log-probs are random, far from the policy's: the weights are uneven
    assert 0.0 < one["loss/is_ess"] < 0.99


def test_a_token_over_the_bound_of_its_release_is_refused():
    groups = random_groups(np.random.default_rng(0), n_groups=2, group_size=2, version=3)
    for g in groups:
        g.release_version = 3
    # at version 6 the tokens are 3 old: fine under the bound in force (4), not under their release's (2)
    assert check_staleness(groups, 6, StepBounds(4)).max() == 3
    with pytest.raises(StalenessError, match="3 versions old.*its bound 2.*under bound 2"):
        check_staleness(groups, 6, StepBounds(4, {3: 2}))
    with pytest.raises(StalenessError, match="bound in force 2"):
        check_staleness(groups, 6, StepBounds(2, {3: 4}))
    bounds = StepBounds(4, {3: 2})
    assert StepBounds.from_json(bounds.to_json()) == bounds


def _auto(**kw) -> StalenessController:
    return StalenessController(StalenessAutoConfig(**kw))


def _kl(value: float) -> dict:
    return {"loss/offpolicy_kl": value, "loss/is_ess": 1.0}


def test_auto_rises_within_target_after_patience():
    c = _auto(floor=1, ceiling=3, target_kl=0.1, patience=2)
    assert c.bound == 1  # starts at the floor
    assert [c.observe(_kl(0.01)) for _ in range(6)] == [1, 2, 2, 3, 3, 3]  # never over the ceiling


def test_auto_halves_at_every_step_over_target_and_rises_only_after_the_old_bound():
    c = _auto(floor=1, ceiling=8, initial=8, target_kl=0.1, patience=1)
    assert [c.observe(_kl(0.5)) for _ in range(4)] == [4, 2, 1, 1]  # never waits to go down; the floor holds
    # the last decrease (from 2) holds rises for 2 steps (the 4th step above was one): groups released under 2 are
    # still being trained
    assert [c.observe(_kl(0.0)) for _ in range(3)] == [1, 2, 3]
    c = _auto(floor=1, ceiling=8, initial=8, target_kl=0.1, patience=1)
    assert c.observe(_kl(0.5)) == 4
    assert [c.observe(_kl(0.0)) for _ in range(9)] == [4] * 8 + [5]  # within target: up only after 8 steps


def test_auto_reads_ess_and_non_finite_figures_as_over():
    c = _auto(floor=0, ceiling=4, initial=4, target_kl=1.0, min_ess=0.5)
    assert c.observe({"loss/offpolicy_kl": 0.01, "loss/is_ess": 0.3}) == 2
    c = _auto(floor=0, ceiling=4, initial=4, target_kl=1.0)
    assert c.observe({"loss/offpolicy_kl": math.nan}) == 2


def test_auto_state_survives_a_checkpoint_and_a_narrower_config():
    c = _auto(floor=0, ceiling=8, initial=8, target_kl=0.1)
    c.observe(_kl(1.0))
    restored = _auto(floor=0, ceiling=8, target_kl=0.1)
    restored.load_state_dict(c.state_dict())
    assert restored.state_dict() == c.state_dict() == {"bound": 4, "hold": 8, "within": 0}
    narrow = _auto(floor=0, ceiling=2, target_kl=0.1)
    narrow.load_state_dict(c.state_dict())
    assert narrow.bound == 2


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"floor": 5, "ceiling": 2}, r"floor \(5\) must be <= .*ceiling \(2\)"),
        (
            {"floor": 1, "ceiling": 4, "initial": 6},
            r"initial \(6\) must lie in \[floor, ceiling\] = \[1, 4\]",
        ),
        ({"min_ess": 1.5}, "less than or equal to 1"),
        ({"target_kl": 0}, "greater than 0"),
    ],
)
def test_bad_auto_configs_name_the_field_and_numbers(overrides, message):
    from config import ConfigError, load_config

    with pytest.raises(ConfigError, match=message):
        load_config(
            "tiny",
            [
                "learner.max_staleness=auto",
                *(f"learner.max_staleness.auto.{k}={v}" for k, v in overrides.items()),
            ],
        )


def test_max_staleness_takes_a_bound_or_auto():
    from config import ConfigError, load_config

    bound = load_config(
        "tiny", ["learner.max_staleness=auto", "learner.max_staleness.auto.ceiling=6"]
    ).learner.max_staleness
    assert is_auto(bound) and largest_bound(bound) == 6 and first_bound(bound) == 0
    bound = load_config("tiny", ["learner.max_staleness=3"]).learner.max_staleness
    assert not is_auto(bound) and largest_bound(bound) == 3 == first_bound(bound)
    for bad, message in (("often", "integer >= 0 or 'auto', got 'often'"), ("-2", ">= 0 or 'auto', got -2")):
        with pytest.raises(ConfigError, match=f"learner.max_staleness.*{message}"):
            load_config("tiny", [f"learner.max_staleness={bad}"])
