"""The `learner.algorithm` union and the algorithm's shape against the rest of the config: every bad shape is an
error at load time that names the fields and their numbers; the Search-R1 presets say what they are."""

from __future__ import annotations

import subprocess
import sys

import pytest

from config import ConfigError, load_config
from learner.algorithms.settings import PPOConfig, ReinforcePPConfig, RLOOConfig


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["learner.ppo_mini_batch_size=7"],
            "learner.ppo_mini_batch_size (7) must divide the batch's trajectories: learner.groups_per_step (8) x "
            "generators.group_size (8) = 64",
        ),
        (["learner.ppo_mini_batch_size=128"], "learner.ppo_mini_batch_size (128) must divide"),
        (
            ["generators.group_size=1", "learner.algorithm.type=rloo"],
            "learner.algorithm.type rloo compares each sample with the others of its group: it needs "
            "generators.group_size >= 2 (got 1",
        ),
        (
            [
                "generators.group_size=1",
                "learner.algorithm.type=ppo",
                "learner.algorithm.dynamic_sampling=true",
            ],
            "learner.algorithm.dynamic_sampling drops groups whose rewards are all equal: it needs "
            "generators.group_size >= 2 (got 1)",
        ),
        (
            ["learner.algorithm.overlong.buffer_tokens=256"],
            "learner.algorithm.overlong.buffer_tokens (256) must be below generators.max_response_tokens (256)",
        ),
        (
            ["learner.algorithm.type=ppo", "learner.algorithm.critic_warmup=40"],
            "learner.algorithm.critic_warmup (40) must be below learner.total_steps (40)",
        ),
        # a field of another variant, an unknown variant, a bad estimator: the message names the field
        (
            ["learner.algorithm.critic_warmup=2"],
            "learner.algorithm.critic_warmup is a setting of ppo, not of 'grpo'",
        ),
        (
            ["learner.algorithm.type=rlhf"],
            "unknown learner.algorithm.type 'rlhf'; known types: grpo, drgrpo, rloo",
        ),
        (["learner.algorithm.kl_estimator=k4"], "learner.algorithm.kl_estimator: Input should be 'k1'"),
        (["learner.algorithm.kl_ctrl.type=adaptive"], "kl_ctrl.type adaptive needs kl_coef > 0"),
        (["learner.algorithm.type=ppo", "learner.algorithm.critic.value_clip=0"], "critic.value_clip"),
        (["learner.ppo_epochs=0"], "learner.ppo_epochs: Input should be greater than or equal to 1"),
    ],
)
def test_bad_algorithm_shapes_name_the_fields(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config("tiny", overrides)
    assert expected in str(err.value)


def test_good_shapes_load_with_each_variants_own_defaults():
    cfg = load_config(
        "tiny", ["learner.algorithm=rloo", "learner.ppo_mini_batch_size=16", "learner.ppo_epochs=2"]
    )
    assert isinstance(cfg.learner.algorithm, RLOOConfig) and cfg.learner.ppo_mini_batch_size == 16
    pp = load_config(
        "tiny", ["learner.algorithm.type=reinforce_pp", "generators.group_size=1"]
    ).learner.algorithm
    assert isinstance(pp, ReinforcePPConfig) and pp.kl_in_reward and pp.kl_estimator == "k1"
    ppo = load_config(
        "tiny", ["learner.algorithm.type=ppo", "learner.algorithm.critic.lr=1e-3"]
    ).learner.algorithm
    assert (
        isinstance(ppo, PPOConfig) and ppo.critic.lr == pytest.approx(1e-3) and ppo.critic.value_clip == 0.5
    )


def test_search_r1_presets_are_its_recipes():
    ppo = load_config("search-r1-ppo-8xh100")
    trajectories = ppo.learner.groups_per_step * ppo.generators.group_size
    assert (
        isinstance(ppo.learner.algorithm, PPOConfig) and trajectories // ppo.learner.ppo_mini_batch_size == 2
    )
    assert (ppo.learner.algorithm.clip_low, ppo.learner.algorithm.clip_high) == (0.2, 0.2)
    assert ppo.learner.algorithm.kl_in_reward and ppo.learner.max_staleness == 0
    grpo = load_config("search-r1-grpo-8xh100")
    assert grpo.learner.algorithm.type == "grpo" and grpo.learner.algorithm.kl_placement == "loss"
    assert grpo.generators.group_size == 5 and grpo.learner.algorithm.kl_estimator == "low_var_kl"
    recommended = load_config("qwen2.5-3b-8xh100")
    assert recommended.learner.algorithm.dynamic_sampling and recommended.learner.max_staleness > 0


def test_config_show_prints_the_ppo_preset():
    shown = subprocess.run(
        [sys.executable, "-m", "sr1", "config", "show", "search-r1-ppo-8xh100"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "type: ppo" in shown and "ppo_mini_batch_size: 256" in shown and "value_clip: 0.5" in shown
