"""Typed configuration of sr1: one root model, a section per pool, YAML presets, env and dotted overrides."""

from config.loader import (
    EXIT_BAD_INPUT,
    EXIT_CHECKPOINT_FAILED,
    ConfigError,
    config_to_yaml,
    list_presets,
    load_config,
    load_job,
    parse_overrides,
    save_config,
    save_job,
)
from config.schema import Config
from config.secret_env import secret_env
from generators.job import GeneratorJob
from learner.job import LearnerJob
from retrieval.job import RetrievalJob

__all__ = [
    "Config",
    "GeneratorJob",
    "LearnerJob",
    "RetrievalJob",
    "ConfigError",
    "EXIT_BAD_INPUT",
    "EXIT_CHECKPOINT_FAILED",
    "config_to_yaml",
    "list_presets",
    "load_config",
    "parse_overrides",
    "save_config",
    "save_job",
    "secret_env",
    "load_job",
]
