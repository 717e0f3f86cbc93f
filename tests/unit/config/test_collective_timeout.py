"""The learner ranks' collective timeout against rank 0's bounded waits inside a collective (issue #49): with several
ranks, a weight broadcast to a hung engine (`weight_sync.timeout_s`) or a Redis call riding out an outage
(`buffer.reconnect_s` + `buffer.socket_timeout_s`) longer than `learner.collective_timeout_s` - 5 s is refused at
load, naming the numbers; one rank has no collective to time out."""

from __future__ import annotations

import pytest

from config import ConfigError, load_config


def test_the_defaults_fit_under_the_default_timeout():
    cfg = load_config("tiny", ["learner.num_ranks=2"])
    assert cfg.learner.collective_timeout_s == 600


def test_a_weight_sync_timeout_past_the_collective_timeout_is_refused_naming_both():
    with pytest.raises(ConfigError) as err:
        load_config(
            "tiny", ["learner.num_ranks=2", "learner.collective_timeout_s=100", "weight_sync.timeout_s=96"]
        )
    message = str(err.value)
    assert (
        "weight_sync.timeout_s (96 s) must be at most learner.collective_timeout_s (100 s) - 5 s" in message
    )
    assert "learner.num_ranks=2" in message


def test_a_redis_outage_ridden_out_past_the_collective_timeout_is_refused():
    overrides = ["learner.num_ranks=4", "learner.collective_timeout_s=60", "weight_sync.timeout_s=30"]
    with pytest.raises(ConfigError, match=r"buffer.reconnect_s \+ buffer.socket_timeout_s \(60 s \+ 10 s\)"):
        load_config("tiny", overrides)
    load_config("tiny", [*overrides, "buffer.reconnect_s=40"])  # 40 + 10 <= 60 - 5


def test_one_rank_has_no_collective_to_time_out():
    cfg = load_config("tiny", ["learner.collective_timeout_s=10", "weight_sync.timeout_s=300"])
    assert cfg.learner.num_ranks == 1


def test_the_timeout_has_a_floor():
    with pytest.raises(ConfigError, match="collective_timeout_s"):
        load_config("tiny", ["learner.collective_timeout_s=5"])
