"""The run's config.yaml is what a resume loads again: a retrieval token the launcher made (`sr1 launch`) is left out
(it is made again), one the user gave is kept masked, and neither is on disk."""

from __future__ import annotations

import pytest

from config import ConfigError, load_config
from sr1.run import Orchestrator

MADE = "made-by-the-launcher-4711"


class _MakesAToken(Orchestrator):
    """`sr1 run`'s set-up with the retrieval placement of `sr1 launch`, which makes a token unless one is given
    (sr1/launch/cluster.py's `_place_retrieval`)."""

    def _place_retrieval(self, cfg):
        cfg = super()._place_retrieval(cfg)
        token = cfg.retrieval.token or MADE
        return cfg.model_copy(update={"retrieval": cfg.retrieval.model_copy(update={"token": token})})


def _prepare(run_dir, overrides):
    orchestrator = _MakesAToken(
        load_config("tiny", overrides), run_dir, resume=False, live=False, startup_timeout_s=30
    )
    try:
        orchestrator.prepare()
    finally:
        if orchestrator.buffer is not None:
            orchestrator.buffer.close()
        orchestrator.supervisor.stop()
        orchestrator.lock.release()
    return orchestrator


def test_a_token_the_launcher_made_is_made_again_on_resume(tmp_path, redis_url, monkeypatch):
    monkeypatch.delenv("SR1_RETRIEVAL__TOKEN", raising=False)
    orchestrator = _prepare(tmp_path / "run", [f"buffer.redis_url={redis_url}"])
    assert orchestrator.cfg.retrieval.token == MADE  # what this start's processes get
    text = (tmp_path / "run" / "config.yaml").read_text()
    assert MADE not in text and "token: null" in text
    assert load_config(tmp_path / "run" / "config.yaml").retrieval.token is None  # resumes: a new one is made


def test_a_token_the_user_gave_is_kept_masked_and_asked_for_again(tmp_path, redis_url, monkeypatch):
    monkeypatch.delenv("SR1_RETRIEVAL__TOKEN", raising=False)
    orchestrator = _prepare(
        tmp_path / "run", [f"buffer.redis_url={redis_url}", "retrieval.token=users-own-0815"]
    )
    assert orchestrator.cfg.retrieval.token == "users-own-0815"
    text = (tmp_path / "run" / "config.yaml").read_text()
    assert "users-own-0815" not in text and "token: '***'" in text
    with pytest.raises(ConfigError, match="SR1_RETRIEVAL__TOKEN"):
        load_config(tmp_path / "run" / "config.yaml")
    monkeypatch.setenv("SR1_RETRIEVAL__TOKEN", "users-own-0815")
    assert load_config(tmp_path / "run" / "config.yaml").retrieval.token == "users-own-0815"
