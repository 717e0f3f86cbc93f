"""The root config: presets, precedence, unknown keys, invariants, the resolved config file."""

from __future__ import annotations

import subprocess
import sys

import pytest

from config import ConfigError, list_presets, load_config, save_config
from config.cli import reference_rows


@pytest.mark.parametrize("preset", list_presets())
def test_every_preset_loads(preset):
    cfg = load_config(preset)
    assert cfg.learner.groups_per_step >= cfg.learner.num_ranks  # every rank gets a group (dealt by tokens)
    assert cfg.model.max_prompt_tokens + cfg.generators.max_response_tokens <= cfg.model.max_seq_len


def test_presets_include_tiny_and_8xh100():
    assert {"tiny", "qwen2.5-3b-8xh100"} <= set(list_presets())


def test_precedence_cli_over_env_over_preset(monkeypatch):
    assert load_config("tiny").learner.lr == pytest.approx(1e-4)  # the preset's value
    monkeypatch.setenv("SR1_LEARNER__LR", "3e-5")
    assert load_config("tiny").learner.lr == pytest.approx(3e-5)
    assert load_config("tiny", ["learner.lr=1e-6"]).learner.lr == pytest.approx(1e-6)


def test_override_values_are_typed():
    cfg = load_config(
        "tiny", ["generators.group_size=4", "buffer.redis_url=redis://x:1/0", "logging.wandb=true"]
    )
    assert cfg.generators.group_size == 4
    assert cfg.buffer.redis_url == "redis://x:1/0"
    assert cfg.logging.wandb is True


@pytest.mark.parametrize(
    "override, expected",
    [
        ("learner.lrr=1", "unknown config key 'learner.lrr'; did you mean lr"),
        ("lerner.lr=1", "unknown config key 'lerner'; did you mean learner"),
        ("learner.lr.x=1", "'learner.lr' is a value, not a section"),
        ("learner.lr", "must look like section.field=value"),
        ("learner.lr=abc", "learner.lr: Input should be a valid number"),
        ("generators.group_size=0", "generators.group_size: Input should be greater than or equal to 1"),
    ],
)
def test_bad_overrides_name_the_key(override, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(".", r"\.")):
        load_config("tiny", [override])


def test_unknown_env_key_is_an_error(monkeypatch):
    monkeypatch.setenv("SR1_LEARNER__LEARNING_RATE", "1")
    with pytest.raises(ConfigError, match="environment variable SR1_LEARNER__LEARNING_RATE"):
        load_config("tiny")


def test_unknown_yaml_key_is_an_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("learner:\n  lr: 1.0e-5\n  groups_per_stepp: 4\n")
    with pytest.raises(ConfigError, match="groups_per_stepp"):
        load_config(path)


def test_invalid_yaml_and_missing_preset(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("learner: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(path)
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        load_config("nope")


def test_any_number_of_learner_ranks_takes_any_batch():
    assert load_config("tiny", ["learner.groups_per_step=9", "learner.num_ranks=2"]).learner.num_ranks == 2
    for ranks in (3, 5, 6, 7):  # Search-R1's 512 groups on every split of 8 GPUs
        assert load_config("search-r1-grpo-8xh100", [f"learner.num_ranks={ranks}"]).learner.num_ranks == ranks
    shown = subprocess.run(
        [sys.executable, "-m", "sr1", "config", "show", "search-r1-grpo-8xh100", "learner.num_ranks=7"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0 and "num_ranks: 7" in shown.stdout, shown.stderr


def test_invariants_carry_the_numbers():
    with pytest.raises(ConfigError, match=r"warmup_steps \(50\) must be <= total_steps \(10\)"):
        load_config("tiny", ["learner.warmup_steps=50", "learner.total_steps=10"])
    with pytest.raises(ConfigError, match=r"= 1192 exceeds model.max_seq_len \(512\)"):
        load_config("tiny", ["generators.max_response_tokens=1000"])
    with pytest.raises(ConfigError, match=r"micro_batch_tokens \(100\) must be >= model.max_seq_len \(512\)"):
        load_config("tiny", ["learner.micro_batch_tokens=100"])


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config("tiny", ["learner.lr=2e-5", "seed=7"])
    path = save_config(cfg, tmp_path / "run")
    again = load_config(path)
    assert again == cfg


def test_every_field_is_documented():
    missing = [key for key, _, _, description in reference_rows() if not description.strip()]
    assert not missing, f"fields without a description: {missing}"


def test_sr1_help_lists_commands_without_importing_heavy_libraries():
    out = subprocess.run([sys.executable, "-m", "sr1", "--help"], capture_output=True, text=True, check=True)
    for command in ("run", "retrieval", "generators", "learner", "buffer", "ask", "config"):
        assert command in out.stdout
    # heavy libraries (torch, vllm) take several seconds to import; the dispatcher must not (counted, not timed)
    modules = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, sr1.cli; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch','vllm','transformers','ray','faiss')))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert modules.stdout.strip() == "[]"
