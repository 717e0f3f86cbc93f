"""scripts/bench/bench_learner_setup.py: the benchmark's learner settings are the preset's with the options over them, run
as the learner plans them (learner/execution/plan.py), with `auto` resolved before the plain step copies it."""

from __future__ import annotations

import pytest

import scripts.bench.bench_learner_setup as setup
from config.loader import load_config  # noqa: E402
from learner.settings import LearnerConfig, LoraSettings  # noqa: E402


def _settings(world, model_dir, *options: str):
    args = setup.parse(["--device", "cpu", "--model", str(model_dir), "--dtype", "float32", *options])
    return setup.learner_settings(args, str(model_dir), world)


def test_the_steps_passes_are_the_trainers_own_decisions():
    """sr1's preset (tis, proximal recompute) forwards the policy before its updates only when the step makes
    several; Search-R1's (no correction) never; both forward the reference (kl_coef 0.001)."""
    ours = load_config("qwen2.5-3b-8xh100").learner
    theirs = load_config("search-r1-grpo-8xh100").learner
    assert setup.step_passes(ours, several_updates=True) == (True, True, False)
    assert setup.step_passes(ours, several_updates=False) == (True, False, False)
    assert setup.step_passes(theirs, several_updates=True) == (True, False, False)
    assert setup.step_passes(LearnerConfig(), several_updates=True)[0] is False  # no KL by default


def test_the_options_reach_the_learners_config_and_its_plan(world, tiny_model_dir):
    settings = _settings(
        world,
        tiny_model_dir,
        "--workload",
        "tiny",
        "--compile",
        "false",
        "--logprob-head",
        "chunked",
        "--checkpointing",
        "every_n",
        "--checkpointing-every",
        "3",
    )
    cfg, execution = settings.cfg, settings.execution
    assert (cfg.compile, cfg.logprob_head) == (False, "chunked")
    assert (cfg.gradient_checkpointing, cfg.gradient_checkpointing_every) == ("every_n", 3)
    assert (execution.checkpointing, execution.checkpointing_every, execution.logprob_head) == (
        "every_n",
        3,
        "chunked",
    )
    assert settings.checkpointing == "every_n" and not execution.compile


def test_auto_is_resolved_and_the_ranks_choice_says_why(world, tiny_model_dir):
    settings = _settings(world, tiny_model_dir, "--workload", "search-r1", "--checkpointing-for-ranks", "6")
    assert settings.cfg.gradient_checkpointing == settings.checkpointing == "none"  # CPU's auto
    assert settings.checkpointing_why.startswith("what a learner of 6 ranks picks")
    assert settings.reference and settings.policy_pass  # the preset's KL and proximal pass over 2 updates


def test_a_policy_the_plain_step_cannot_copy_asks_for_no_plain(world, tiny_model_dir):
    with pytest.raises(
        SystemExit, match="plain step checkpoints none, full, every_n, not selective.*--no-plain"
    ):
        _settings(world, tiny_model_dir, "--workload", "tiny", "--checkpointing", "selective", "--plain")
    assert _settings(
        world, tiny_model_dir, "--workload", "tiny", "--checkpointing", "selective"
    ).checkpointing == ("selective")


def test_the_lora_options_become_learner_lora_over_a_presets_own(world, tiny_model_dir):
    """--lora-rank and --lora-targets are learner.lora's rank and target_modules (defaults: learner.lora's, every
    linear layer); over a LoRA preset they replace only what they name. LoRA's KL reference is the base with the
    adapters off: the step still forwards it, the memory plan holds no copy of it."""
    settings = _settings(world, tiny_model_dir, "--workload", "search-r1", "--lora-rank", "8")
    lora = settings.cfg.lora
    assert (lora.rank, lora.alpha, lora.target_modules) == (8, 32.0, list(LoraSettings().target_modules))
    assert settings.reference and settings.checkpointing == "full"  # the preset's KL and checkpointing
    preset = ["--workload", "search-r1", "--preset", "search-r1-grpo-lora-1xh100"]
    over = _settings(world, tiny_model_dir, *preset, "--lora-targets", "q_proj,v_proj").cfg.lora
    assert (over.rank, over.target_modules) == (16, ["q_proj", "v_proj"])
    assert _settings(world, tiny_model_dir, "--workload", "tiny").cfg.lora is None  # full weights by default


def test_bad_lora_options_are_refused_naming_what_was_wrong(world, tiny_model_dir, capsys):
    with pytest.raises(SystemExit, match="(?s)bad learner settings.*may not name \\['lm_head'\\]"):
        _settings(world, tiny_model_dir, "--workload", "tiny", "--lora-targets", "q_proj,lm_head")
    with pytest.raises(SystemExit, match="plain step trains every weight.*--no-plain"):
        _settings(world, tiny_model_dir, "--workload", "tiny", "--lora-rank", "4", "--plain")
    with pytest.raises(SystemExit):
        setup.parse(["--device", "cpu", "--lora-rank", "0"])
    assert "--lora-rank must be >= 1, got 0" in capsys.readouterr().err
