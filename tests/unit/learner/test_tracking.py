"""The tracker: metrics.jsonl rows, evaluation rows, and one wandb run per sr1 run (its id kept for resumes), run
against the real wandb in offline mode: what it writes under `<run_dir>/wandb` is checked, secrets included."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import wandb

from common.sections import LoggingConfig
from learner.checkpoints.safety_net import CheckpointsFailing
from learner.tracking import RecordsFailing, Tracker, append_line

PASSWORD = "s3cret-redis-pw-4711"
TOKEN = "t0ken-for-retrieval-0815"
CONFIG = {
    "seed": 0,
    "buffer": {"redis_url": f"redis://sr1:{PASSWORD}@10.0.0.5:6379/0", "namespace": "sr1"},
    "retrieval": {"token": TOKEN, "topk": 3},
}


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """The real wandb, offline (no network, no account), quiet, its own files under tmp_path."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def _offline_runs(run_dir: Path, run_id: str) -> list[Path]:
    return sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}"))


def test_rows_steps_segments_and_evaluations(tmp_path):
    tracker = Tracker(tmp_path, LoggingConfig())
    tracker.mark_segment({"start": 0})
    tracker.log({"loss/pg": 0.5}, step=1)
    tracker.log_eval({"eval/em": 0.4, "eval/em/nq": 0.3, "step": 2}, step=2)
    tracker.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0] == {"segment": {"start": 0}}
    assert rows[1]["step"] == 1 and rows[1]["loss/pg"] == 0.5
    assert "step" not in rows[2] and rows[2]["eval_step"] == 2 and rows[2]["eval/em/nq"] == 0.3


def test_wandb_offline_starts_logs_finishes_and_a_resume_continues_the_same_run(tmp_path, offline_wandb):
    run_dir = tmp_path / "run"
    cfg = LoggingConfig(wandb=True, wandb_mode="offline", wandb_project="sr1-test")
    first = Tracker(run_dir, cfg, config=CONFIG)
    first.log({"loss/pg": 0.5, "batch/reward_mean": 0.25}, step=3)
    first.log_eval({"eval/em": 0.4, "eval/reward/nq": 0.3}, step=2)
    first.close()
    run_id = (run_dir / "wandb_run_id").read_text().strip()
    assert len(run_id) == 8 and run_id.isalnum() and run_id.islower()
    again = Tracker(run_dir, cfg)  # a resumed learner, or `sr1 run`'s final evaluation
    again.log({"loss/pg": 0.25}, step=4)
    again.close()
    wandb.teardown()  # wandb's service writes its files after `finish` returns: done once it has stopped
    assert (run_dir / "wandb_run_id").read_text().strip() == run_id
    runs = _offline_runs(run_dir, run_id)
    assert runs, f"no offline run of id {run_id} under {run_dir / 'wandb'}: {os.listdir(run_dir / 'wandb')}"
    log = (runs[0] / f"run-{run_id}.wandb").read_bytes()  # wandb's record log: config, history, summary
    # the metrics under sr1's and Search-R1's names, the evaluation charted against eval/step
    for key in (b"loss/pg", b"actor/pg_loss", b"critic/score/mean", b"eval/step", b"val/test_score/nq"):
        assert key in log, key
    # the config went to wandb with the password and the token masked
    assert b"redis://sr1:***@10.0.0.5:6379/0" in log
    assert b"sr1-test" in log or b"sr1-test" in (runs[0] / "logs" / "debug.log").read_bytes()


def test_no_secret_reaches_wandb_or_any_file_of_the_run(tmp_path, offline_wandb, monkeypatch):
    run_dir = tmp_path / "run"
    argv = ["sr1", "run", f"retrieval.token={TOKEN}", f"buffer.redis_url={CONFIG['buffer']['redis_url']}"]
    monkeypatch.setattr(sys, "argv", argv)  # `sr1 run`'s final evaluation: wandb records its command line
    tracker = Tracker(run_dir, LoggingConfig(wandb=True, wandb_mode="offline"), config=CONFIG)
    assert sys.argv == argv  # given back as it was
    tracker.log({"loss/pg": 0.5}, step=1)
    tracker.close()
    wandb.teardown()
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in files)
    for path in files:
        data = path.read_bytes()
        assert PASSWORD.encode() not in data and TOKEN.encode() not in data, path
    log = next(p for p in files if p.suffix == ".wandb").read_bytes()
    assert b"retrieval.token=***" in log  # the command line, masked


def test_other_ranks_write_nothing(tmp_path):
    tracker = Tracker(tmp_path, LoggingConfig(wandb=True), rank=1)
    tracker.log({"loss/pg": 0.5}, step=1)
    tracker.close()
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "wandb").exists()


def test_metrics_are_logged_under_search_r1_names_too(tmp_path):
    tracker = Tracker(tmp_path, LoggingConfig())
    tracker.log({"batch/reward_mean": 0.25, "loss/pg": -0.1, "perf/step_s": 3.0, "staleness/max": 1}, step=4)
    tracker.log_eval({"eval/reward": 0.5, "eval/reward/nq": 0.4, "eval/em/nq": 0.4}, step=4)
    tracker.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["critic/score/mean"] == rows[0]["batch/reward_mean"] == 0.25
    assert rows[0]["actor/pg_loss"] == -0.1 and rows[0]["timing_s/step"] == 3.0
    assert rows[1]["val/test_score/nq"] == 0.4 and "val/test_score/em" not in str(rows[1])


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (every write: ENOSPC)")
def test_a_full_disk_under_metrics_stops_the_learner_as_a_full_disk_under_checkpoints(tmp_path):
    (tmp_path / "metrics.jsonl").symlink_to("/dev/full")  # a real ENOSPC on every write
    tracker = Tracker(tmp_path, LoggingConfig())
    with pytest.raises(
        RecordsFailing, match=r"metrics\.jsonl.*No space left.*free space there.*--resume"
    ) as err:
        tracker.log({"loss/pg": 0.5}, step=1)
    # the learner's entry point exits 74 on CheckpointsFailing, which supervisors do not restart
    assert isinstance(err.value, CheckpointsFailing)
    tracker.close()  # closing after it says nothing more


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (every write: ENOSPC)")
def test_append_line_lets_other_write_errors_through(tmp_path):
    path = tmp_path / "learner_groups.jsonl"
    full = open("/dev/full", "a", buffering=1)  # noqa: SIM115 (its close fails too: the line is still buffered)
    with pytest.raises(RecordsFailing, match="learner_groups"):
        append_line(full, "{}", path)
    with pytest.raises(OSError):
        full.close()
    with open(tmp_path / "x", "w") as f:
        f.close()
        with pytest.raises(ValueError):  # not a full disk: not turned into a stop
            append_line(f, "{}", path)
