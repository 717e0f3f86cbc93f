"""Non-finite numbers and booleans given for numbers are refused, naming the key, from every source."""

from __future__ import annotations

import pytest

from config import ConfigError, LearnerJob, load_config, load_job, save_job


@pytest.mark.parametrize(
    "override, key",
    [
        ("learner.lr=1e999", "learner.lr"),
        ("learner.lr=inf", "learner.lr"),
        ("learner.weight_decay=.inf", "learner.weight_decay"),
        ("learner.betas=[.nan, 0.999]", "learner.betas"),
        ("learner.betas=[0.9, .inf]", "learner.betas"),
    ],
)
def test_non_finite_numbers_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError, match="finite") as err:
        load_config("tiny", [override])
    assert key in str(err.value)


@pytest.mark.parametrize(
    "override, key",
    [
        ("learner.max_staleness=true", "learner.max_staleness"),
        ("learner.groups_per_step=on", "learner.groups_per_step"),
        ("learner.lr=yes", "learner.lr"),
        ("learner.correction.cap=false", "learner.correction.cap"),
    ],
)
def test_booleans_are_not_numbers(override, key):
    with pytest.raises(ConfigError, match="boolean") as err:
        load_config("tiny", [override])
    assert key in str(err.value)


def test_booleans_still_set_boolean_fields():
    assert load_config("tiny", ["data.shuffle=false"]).data.shuffle is False


def test_a_non_finite_environment_variable_is_refused(monkeypatch):
    monkeypatch.setenv("SR1_LEARNER__LR", "inf")
    with pytest.raises(ConfigError, match="learner.lr"):
        load_config("tiny")


def test_a_preset_file_with_a_boolean_number_is_refused(tmp_path):
    preset = tmp_path / "mine.yaml"
    preset.write_text("learner:\n  max_staleness: true\n")
    with pytest.raises(ConfigError, match=r"mine.yaml: learner.max_staleness"):
        load_config(preset)


def test_a_job_file_is_checked_too(tmp_path):
    path = save_job(load_config("tiny").learner_job(), tmp_path / "learner.yaml")
    with pytest.raises(ConfigError, match="learner.max_staleness"):
        load_job(LearnerJob, path, ["learner.max_staleness=true"])
    with pytest.raises(ConfigError, match="learner.lr"):
        load_job(LearnerJob, path, ["learner.lr=1e999"])


def test_config_show_masks_the_redis_password_and_the_retrieval_token(capsys):
    from config.cli import main

    assert (
        main(["show", "buffer.redis_url=redis://sr1:hunter2@10.0.0.1:6379/0", "retrieval.token=tok3n"]) == 0
    )
    shown = capsys.readouterr().out
    assert "hunter2" not in shown and "tok3n" not in shown and "redis://sr1:***@10.0.0.1:6379/0" in shown
