"""The tracker: metrics.jsonl rows, evaluation rows, and one wandb run per sr1 run (its id kept for resumes)."""

from __future__ import annotations

import json
import sys
import types

from common.sections import LoggingConfig
from learner.tracking import Tracker


class _FakeRun:
    def __init__(self, calls: list, **kwargs):
        self.calls = calls
        calls.append(("init", kwargs))

    def define_metric(self, name, **kwargs):
        self.calls.append(("define_metric", name, kwargs))

    def log(self, values, step=None):
        self.calls.append(("log", values, step))

    def finish(self):
        self.calls.append(("finish",))


def _fake_wandb(monkeypatch) -> list:
    """A stand-in for the wandb package with the calls the tracker makes (no network here)."""
    calls: list = []
    ids = iter(["run-a", "run-b"])
    module = types.SimpleNamespace(
        init=lambda **kwargs: _FakeRun(calls, **kwargs),
        util=types.SimpleNamespace(generate_id=lambda: next(ids)),
    )
    monkeypatch.setitem(sys.modules, "wandb", module)
    return calls


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


def test_a_resumed_run_continues_the_same_wandb_run(tmp_path, monkeypatch):
    calls = _fake_wandb(monkeypatch)
    cfg = LoggingConfig(wandb=True, wandb_mode="online", wandb_entity="lab", wandb_project="sr1-test")
    first = Tracker(tmp_path, cfg, config={"seed": 0})
    first.log({"loss/pg": 0.5}, step=3)
    first.log_eval({"eval/em": 0.4}, step=2)
    first.close()
    assert (tmp_path / "wandb_run_id").read_text().strip() == "run-a"
    again = Tracker(tmp_path, cfg)  # a resumed learner, or `sr1 run`'s final evaluation
    again.close()
    inits = [c[1] for c in calls if c[0] == "init"]
    assert [i["id"] for i in inits] == ["run-a", "run-a"] and all(i["resume"] == "allow" for i in inits)
    assert inits[0]["mode"] == "online" and inits[0]["entity"] == "lab" and inits[0]["project"] == "sr1-test"
    assert ("define_metric", "eval/*", {"step_metric": "eval/step"}) in calls
    logs = [c for c in calls if c[0] == "log"]
    assert logs[0] == ("log", {"loss/pg": 0.5, "actor/pg_loss": 0.5}, 3)  # and its Search-R1 name
    assert logs[1] == (
        "log",
        {"eval/em": 0.4, "eval/step": 2},
        3,
    )  # at the latest training step, charted by eval/step


def test_other_ranks_write_nothing(tmp_path):
    tracker = Tracker(tmp_path, LoggingConfig(), rank=1)
    tracker.log({"loss/pg": 0.5}, step=1)
    tracker.close()
    assert not (tmp_path / "metrics.jsonl").exists()


def test_metrics_are_logged_under_search_r1_names_too(tmp_path, monkeypatch):
    calls = _fake_wandb(monkeypatch)
    tracker = Tracker(tmp_path, LoggingConfig(wandb=True))
    tracker.log({"batch/reward_mean": 0.25, "loss/pg": -0.1, "perf/step_s": 3.0, "staleness/max": 1}, step=4)
    tracker.log_eval({"eval/reward": 0.5, "eval/reward/nq": 0.4, "eval/em/nq": 0.4}, step=4)
    tracker.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["critic/score/mean"] == rows[0]["batch/reward_mean"] == 0.25
    assert rows[0]["actor/pg_loss"] == -0.1 and rows[0]["timing_s/step"] == 3.0
    assert rows[1]["val/test_score/nq"] == 0.4 and "val/test_score/em" not in str(rows[1])
    logged = [c[1] for c in calls if c[0] == "log"]
    assert logged[0]["critic/score/mean"] == 0.25 and logged[1]["val/test_score/nq"] == 0.4
    assert ("define_metric", "val/*", {"step_metric": "eval/step"}) in calls
