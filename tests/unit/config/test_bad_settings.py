"""Settings that used to pass and fail later, or lock users out, are refused when the config is loaded, naming the
key: AdamW betas outside [0, 1) (NaN included), a port outside 1..65535, an empty retrieval token."""

from __future__ import annotations

import math

import pytest

from config import ConfigError, load_config
from learner.settings import LearnerConfig
from weight_sync.settings import WeightSyncConfig


@pytest.mark.parametrize(
    "override, key, message",
    [
        ("learner.betas=[1.0, 0.999]", "learner.betas", r"betas\[0\] must be a finite number in \[0, 1\)"),
        ("learner.betas=[0.9, -0.1]", "learner.betas", r"betas\[1\] must be a finite number in \[0, 1\)"),
        ("learner.betas=[.nan, 0.999]", "learner.betas", r"betas\[0\] must be a finite number"),
        ("weight_sync.master_port=70000", "weight_sync.master_port", "less than or equal to 65535"),
        ("weight_sync.master_port=0", "weight_sync.master_port", "greater than or equal to 1"),
        ("retrieval.token=''", "retrieval.token", "omit it"),
    ],
)
def test_a_bad_setting_is_refused_naming_the_key(override, key, message):
    with pytest.raises(ConfigError, match=message) as caught:
        load_config("tiny", [override])
    assert key in str(caught.value)


def test_betas_refuse_nan_when_built_in_code_too():
    with pytest.raises(ValueError, match=r"betas\[0\] must be a finite number"):
        LearnerConfig(betas=(math.nan, 0.999))
    assert LearnerConfig(betas=(0.0, 0.95)).betas == (0.0, 0.95)


def test_a_free_master_port_is_still_none():
    assert WeightSyncConfig().master_port is None and WeightSyncConfig(master_port=29500).master_port == 29500
