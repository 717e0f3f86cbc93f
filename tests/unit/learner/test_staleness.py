"""The off-policy diagnostics (importance-weight ESS, the bound in force) and `learner.max_staleness: auto`'s
controller, against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from learner.settings import StalenessAutoConfig
from learner.staleness import StalenessController
from learner.trainer import StalenessError, StepBounds, check_staleness, effective_sample_size
from tests.fakes.groups import random_groups


def test_ess_by_hand():
    # weights 1, 1, 1, 1: every sample counts
    assert effective_sample_size(4.0, 4.0, 4) == pytest.approx(1.0)
    # weights 2, 0, 0, 0: (2)^2 / (4 * 4) = 1/4, one sample of four carries everything
    assert effective_sample_size(2.0, 4.0, 4) == pytest.approx(0.25)
    # weights 1, 3: (4)^2 / (2 * 10) = 0.8
    assert effective_sample_size(4.0, 10.0, 2) == pytest.approx(0.8)
    assert effective_sample_size(0.0, 0.0, 0) == 1.0  # no tokens: nothing to say


def test_policy_loss_reports_the_raw_weights_whatever_the_correction():
    """The ESS uses pi / mu before truncation or masking: the same figure under `none`, `tis` and `icepop`."""
    from learner.algorithms.base import policy_loss
    from learner.algorithms.settings import GRPOConfig, IcePopCorrection, NoCorrection, TISCorrection

    logprobs = torch.log(torch.tensor([0.5, 0.2, 0.9, 0.4]))
    behavior = torch.log(torch.tensor([0.5, 0.4, 0.3, 0.4]))  # weights 1, 0.5, 3, 1
    n, weights = 4, np.array([1.0, 0.5, 3.0, 1.0])
    expected = weights.sum() ** 2 / (n * np.square(weights).sum())
    for correction in (NoCorrection(), TISCorrection(cap=2.0), IcePopCorrection()):
        _, stats = policy_loss(
            logprobs, behavior, torch.ones(4), torch.ones(4), torch.zeros(4), GRPOConfig(), correction
        )
        ess = effective_sample_size(float(stats["raw_weight"].sum()), float(stats["raw_weight_sq"].sum()), n)
        assert ess == pytest.approx(expected, rel=1e-6)
        assert float(stats["raw_weight"][2]) == pytest.approx(3.0, rel=1e-5)  # not capped at 2 by tis


def test_the_trainer_reports_ess_and_the_bound(world, tiny_model_dir):
    from learner.settings import LearnerConfig
    from learner.trainer import Learner

    learner = Learner(LearnerConfig(groups_per_step=2, micro_batch_tokens=512), tiny_model_dir, world)
    groups = random_groups(np.random.default_rng(3), n_groups=2, group_size=3, version=0)
    metrics = learner.train_step(groups, StepBounds(5, {0: 4}))
    assert 0.0 < metrics["loss/is_ess"] <= 1.0
    assert metrics["staleness/bound"] == 5
    # the fake behaviour log-probs are random, far from the policy's: the weights are uneven
    assert metrics["loss/is_ess"] < 0.99


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
    return {"loss/mismatch_kl": value, "loss/is_ess": 1.0}


def test_auto_rises_within_target_after_patience():
    c = _auto(floor=1, ceiling=3, target_kl=0.1, patience=2)
    assert c.bound == 1  # starts at the floor
    assert [c.observe(_kl(0.01)) for _ in range(6)] == [1, 2, 2, 3, 3, 3]  # never over the ceiling


def test_auto_halves_over_target_then_holds_for_the_old_bound():
    c = _auto(floor=1, ceiling=8, initial=8, target_kl=0.1, patience=1)
    assert c.observe(_kl(0.5)) == 4
    # the groups released under 8 are trained for 8 more steps: no move on what they show
    assert [c.observe(_kl(0.5)) for _ in range(8)] == [4] * 8
    assert c.observe(_kl(0.5)) == 2
    assert [c.observe(_kl(0.5)) for _ in range(4)] == [2] * 4
    assert c.observe(_kl(0.5)) == 1
    assert [c.observe(_kl(0.5)) for _ in range(3)] == [1] * 3  # the floor holds
    assert c.observe(_kl(0.0)) == 2  # within target again: one up


def test_auto_reads_ess_and_non_finite_figures_as_over():
    c = _auto(floor=0, ceiling=4, initial=4, target_kl=1.0, min_ess=0.5)
    assert c.observe({"loss/mismatch_kl": 0.01, "loss/is_ess": 0.3}) == 2
    c = _auto(floor=0, ceiling=4, initial=4, target_kl=1.0)
    assert c.observe({"loss/mismatch_kl": math.nan}) == 2


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
                *(f"learner.staleness_auto.{k}={v}" for k, v in overrides.items()),
            ],
        )


def test_max_staleness_takes_a_bound_or_auto():
    from config import ConfigError, load_config

    cfg = load_config("tiny", ["learner.max_staleness=auto", "learner.staleness_auto.ceiling=6"]).learner
    assert cfg.auto_staleness and cfg.staleness_ceiling == 6 and cfg.initial_staleness == 0
    cfg = load_config("tiny", ["learner.max_staleness=3"]).learner
    assert not cfg.auto_staleness and cfg.staleness_ceiling == 3 == cfg.initial_staleness
    for bad, message in (("often", "integer >= 0 or 'auto', got 'often'"), ("-2", ">= 0 or 'auto', got -2")):
        with pytest.raises(ConfigError, match=f"learner.max_staleness.*{message}"):
            load_config("tiny", [f"learner.max_staleness={bad}"])
