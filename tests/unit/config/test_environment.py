"""SR1_* environment variables: each is a config key, sr1's own process variables are not read, typos are loud."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from config import ConfigError, load_config
from config.environment import NOT_CONFIG, env_name
from config.loader import leaf_keys
from sr1.entrypoints.retrieval import load_retrieval_config, parse_args

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("sr1", "world", "config", "learner", "generators", "evaluation", "tasks", "retrieval")
PACKAGES += ("weight_sync", "buffer", "common", "scripts")


def test_the_retrieval_token_variable_is_the_config_key_with_or_without_a_config(monkeypatch):
    monkeypatch.setenv("SR1_RETRIEVAL__TOKEN", "s3cret")
    assert load_config("tiny").retrieval.token == "s3cret"
    assert (
        load_retrieval_config(parse_args(["serve"])).token == "s3cret"
    )  # `sr1 retrieval serve`, no --config
    assert load_retrieval_config(parse_args(["serve", "--token", "flag"])).token == "flag"


@pytest.mark.parametrize("name", sorted(NOT_CONFIG))
def test_sr1s_own_process_variables_are_neither_read_nor_refused(monkeypatch, name):
    expected = load_config("tiny")
    monkeypatch.setenv(name, "1")
    assert load_config("tiny") == expected


@pytest.mark.parametrize(
    "name, meant",
    [
        ("SR1_RETRIEVAL_TOKEN", "retrieval.token is SR1_RETRIEVAL__TOKEN"),
        ("SR1_LEARNER_LR", "learner.lr is SR1_LEARNER__LR"),
        ("SR1_BUFFER__REDIS__URL", "buffer.redis_url is SR1_BUFFER__REDIS_URL"),
    ],
)
def test_a_key_spelled_with_single_underscores_is_an_error_naming_its_variable(monkeypatch, name, meant):
    monkeypatch.setenv(name, "x")
    with pytest.raises(ConfigError, match=f"environment variable {name} is not a config key.*{meant}"):
        load_config("tiny")


def test_a_variable_that_names_no_key_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv("SR1_RETRIEVL__TOKEN", "x")
    with pytest.raises(
        ConfigError, match="environment variable SR1_RETRIEVL__TOKEN: unknown config key 'retrievl'"
    ):
        load_config("tiny")


def _sr1_names_in_the_code() -> dict[str, str]:
    """Every string constant of the project's code that is a whole SR1_* variable name -> where it is."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                name = node.value if isinstance(node, ast.Constant) else None
                if isinstance(name, str) and re.fullmatch(r"SR1_[A-Z0-9_]+", name):
                    found[name] = f"{path.relative_to(ROOT)}:{node.lineno}"
    return found


def test_every_sr1_variable_the_code_names_is_a_config_key_or_listed_as_sr1s_own():
    names = _sr1_names_in_the_code()
    assert "SR1_DIE_WITH_PARENT" in names and "SR1_BUFFER__REDIS_URL" in names  # the scan finds them
    config_names = {env_name(key) for key in leaf_keys()}
    stray = {name: where for name, where in names.items() if name not in config_names | set(NOT_CONFIG)}
    assert not stray, (
        f"SR1_* names that are neither a config key nor in config/environment.py's NOT_CONFIG: {stray}"
    )
