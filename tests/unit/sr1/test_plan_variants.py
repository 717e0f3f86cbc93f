"""The planner reads what an algorithm owns: an algorithm with a critic, added as one member of the family (here, in
the test only), gets a critic in the plan's memory without any edit to `sr1/plan/`."""

from __future__ import annotations

from typing import ClassVar, Literal

import pytest
from pydantic import Field

import sr1.plan.splits
from config import load_config
from learner.algorithms.settings import ALGORITHMS, CriticConfig, PolicyLossConfig
from sr1.plan.profile import load_profile
from sr1.plan.splits import make_plan

SHRINK = ["learner.groups_per_step=16", "learner.ppo_mini_batch_size=16", "generators.max_inflight_groups=8"]


class ActorCriticConfig(PolicyLossConfig):
    """A throwaway actor-critic: a value model beside the policy, and nothing else of PPO's."""

    needs_critic: ClassVar[bool] = True

    type: Literal["throwaway_ac"] = Field("throwaway_ac", description="Which algorithm (the union's tag).")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="The value model.")


@pytest.fixture
def throwaway_algorithm(monkeypatch):
    monkeypatch.setitem(ALGORITHMS.members, "throwaway_ac", ActorCriticConfig)  # removed again after the test
    return ActorCriticConfig


@pytest.mark.parametrize(("algorithm", "critic"), [("throwaway_ac", True), ("grpo", False)])
def test_the_planner_plans_a_critic_for_any_algorithm_that_owns_one(
    throwaway_algorithm, monkeypatch, algorithm, critic
):
    cfg = load_config("search-r1-grpo-8xh100", [*SHRINK, f"learner.algorithm.type={algorithm}"])
    assert type(cfg.learner.algorithm).__name__ == ("ActorCriticConfig" if critic else "GRPOConfig")
    checked = []
    real_check = sr1.plan.splits.check_memory

    def check_memory(*args, **kwargs):
        checked.append(kwargs["critic"])
        return real_check(*args, **kwargs)

    monkeypatch.setattr(sr1.plan.splits, "check_memory", check_memory)
    make_plan(cfg, load_profile("qwen2.5-3b-h100"), gpus=2, kind="h100", bounds=[0], steps=3, warmup=1)
    assert checked and set(checked) == {critic}


def test_registering_a_second_algorithm_under_a_taken_name_is_refused(throwaway_algorithm):
    taken = type("OtherPPO", (ActorCriticConfig,), {"__annotations__": {}})
    with pytest.raises(TypeError, match="'throwaway_ac' is already ActorCriticConfig's"):
        ALGORITHMS.register(taken)
