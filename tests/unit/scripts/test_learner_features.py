"""scripts/learner_features.py: the benchmark finds the learner's optional settings and functions by what the tree
has, so it runs on a learner with or without them (and maps today's bool checkpointing to full / none)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))

import learner_features as features  # noqa: E402

from config.loader import load_config  # noqa: E402
from learner.settings import LearnerConfig  # noqa: E402


class PolicyConfig(BaseModel):
    """A learner config of the shape the compiled-layers work gives it: policies, compile, attention."""

    gradient_checkpointing: Literal["auto", "full", "every_n", "selective", "none"] | bool = "auto"
    gradient_checkpointing_every: int = 2
    compile: Literal["auto"] | bool = "auto"
    attention: str = "auto"


def test_a_bool_checkpointing_takes_full_and_none_and_refuses_the_rest():
    overrides = dict(compile="auto", every=None, attention="auto")
    assert features.config_overrides(LearnerConfig, checkpointing="full", **overrides) == {
        "gradient_checkpointing": True
    }
    assert features.config_overrides(LearnerConfig, checkpointing="none", **overrides) == {
        "gradient_checkpointing": False
    }
    assert features.config_overrides(LearnerConfig, checkpointing=None, **overrides) == {}
    with pytest.raises(ValueError, match="--checkpointing every_n: .* is a bool"):
        features.config_overrides(LearnerConfig, checkpointing="every_n", **overrides)
    with pytest.raises(ValueError, match="--compile true: this learner has no learner.compile"):
        features.config_overrides(
            LearnerConfig, compile="true", checkpointing=None, every=None, attention="auto"
        )
    with pytest.raises(ValueError, match="gradient_checkpointing_every"):
        features.config_overrides(
            LearnerConfig, compile="auto", checkpointing=None, every=3, attention="auto"
        )
    assert features.learner_kwargs(LearnerConfig, "sr1_varlen_sdpa") == {"attention": "sr1_varlen_sdpa"}


def test_a_learner_with_policies_gets_them_in_its_config():
    assert features.config_overrides(
        PolicyConfig, compile="false", checkpointing="every_n", every=3, attention="sr1_flex_document"
    ) == {
        "compile": False,
        "gradient_checkpointing": "every_n",
        "gradient_checkpointing_every": 3,
        "attention": "sr1_flex_document",
    }
    assert features.config_overrides(
        PolicyConfig, compile="auto", checkpointing=None, every=None, attention="auto"
    ) == {"compile": "auto"}
    assert features.learner_kwargs(PolicyConfig, "sr1_flex_document") == {}
    assert [features.checkpointing_name(v) for v in (True, False, "selective")] == [
        "full",
        "none",
        "selective",
    ]


def test_the_steps_passes_are_the_trainers_own_decisions():
    """sr1's preset (tis, proximal recompute) forwards the policy before its updates only when the step makes
    several; Search-R1's (no correction) never; both forward the reference (kl_coef 0.001)."""
    ours = load_config("qwen2.5-3b-8xh100").learner
    theirs = load_config("search-r1-grpo-8xh100").learner
    assert features.step_passes(ours, several_updates=True) == (True, True, False)
    assert features.step_passes(ours, several_updates=False) == (True, False, False)
    assert features.step_passes(theirs, several_updates=True) == (True, False, False)
    assert features.step_passes(LearnerConfig(), several_updates=True)[0] is False  # no KL by default


def test_compiler_counters_count_graphs_and_recompilations():
    import torch

    before = features.compiler_counters()

    def double_plus_one(x):
        return x * 2 + 1

    compiled = torch.compile(double_plus_one, backend="eager")
    compiled(torch.ones(3))
    compiled(torch.ones(5))  # a new shape: compiled again, with dynamic shapes
    compiled(torch.ones(7))  # covered by the dynamic graph
    counts = features.counters_since(before, features.compiler_counters())
    assert counts == {"graphs": 2, "recompiles": 1, "graph_breaks": 0}


def test_the_checkpointing_of_n_ranks_is_none_where_the_estimate_fits(tiny_model_dir):
    cfg = LearnerConfig(micro_batch_tokens=4096)
    policy, why = features.checkpointing_for_ranks(
        cfg, tiny_model_dir, ranks=6, capacity=2**40, dtype="bfloat16"
    )
    assert policy == "none" and "on 6 ranks at 4096 tokens" in why and "<=" in why
    policy, why = features.checkpointing_for_ranks(
        cfg, tiny_model_dir, ranks=6, capacity=2**20, dtype="bfloat16"
    )
    assert policy == "full" and ">" in why


def test_present_lists_what_this_tree_has():
    assert set(features.present()) >= {"learner.compile", "compiler counters", "memory estimate function"}
