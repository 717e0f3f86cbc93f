"""The live view reads only what the learner's metrics file gained, and waits for half-written lines."""

from __future__ import annotations

from types import SimpleNamespace

from sr1.live import LiveView


def test_live_view_follows_metrics_incrementally(tmp_path):
    view = LiveView(SimpleNamespace(run_dir=tmp_path, started=0.0), enabled=False)
    view._read_new_metrics()  # no file yet
    assert view.last_metrics == {}
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"st')
    view._read_new_metrics()
    assert view.last_metrics == {"step": 2}
    with open(path, "a") as f:
        f.write('ep": 3}\n')
    view._read_new_metrics()
    assert view.last_metrics == {"step": 3}
    view._read_new_metrics()  # nothing new: the last row stays
    assert view.last_metrics == {"step": 3}


def test_the_live_view_says_which_generators_paused_and_why():
    from sr1.live import paused_reason

    running = {"rollout/state": "running", "rollout/pause_reason": ""}
    paused = {"rollout/state": "paused", "rollout/pause_reason": "8 of 8 tool calls failed in the last 30 s"}
    assert paused_reason([running, running]) is None
    assert (
        paused_reason([running, paused]) == "1 of 2 generator(s): 8 of 8 tool calls failed in the last 30 s"
    )


def test_the_live_view_shows_redis_memory_used_and_max():
    from buffer.monitor import memory_text

    assert memory_text({"buffer/redis_used_mb": None}) is None  # a Redis user without INFO
    assert (
        memory_text({"buffer/redis_used_mb": 12.4, "buffer/redis_maxmemory_mb": 0}) == "12 MiB (no maxmemory)"
    )
    full = {"buffer/redis_used_mb": 930.0, "buffer/redis_maxmemory_mb": 1000.0, "buffer/memory_paused": 1}
    assert memory_text(full) == "930 / 1,000 MiB (93%, releases paused)"


def test_the_live_view_shows_the_last_good_checkpoint_and_failures_since():
    from sr1.live import checkpoint_state

    assert checkpoint_state({"step": 1}) is None
    assert checkpoint_state({"checkpoint/last_good_step": 8.0, "checkpoint/failed_in_a_row": 0.0}) == "step 8"
    assert checkpoint_state({"checkpoint/last_good_step": 4.0, "checkpoint/failed_in_a_row": 1.0}) == (
        "step 4; 1 failed since (logs/learner.log says why)"
    )


def test_the_live_view_estimates_the_training_left_from_the_steps_it_saw():
    view = LiveView(SimpleNamespace(run_dir=None, started=0.0), enabled=False)
    assert view.training_left_s(None, 40, now=10.0) is None  # no step yet
    assert view.training_left_s(2, 40, now=10.0) is None  # the first step seen: no rate yet
    assert view.training_left_s(2, 40, now=12.0) is None  # still the same step
    assert view.training_left_s(12, 40, now=30.0) == 28 * 2.0  # 10 steps in 20 s: 2 s a step, 28 steps left


def test_a_phase_of_the_run_logs_through_the_view_without_a_terminal(capsys):
    view = LiveView(SimpleNamespace(run_dir=None, started=0.0), enabled=False)
    with view.phase("starting the vLLM engine", expected_s=30) as phase:
        phase.interval_s = 60
    out = capsys.readouterr().out
    assert "[starting the vLLM engine] done: in 0 s" in out and out.startswith("[")
