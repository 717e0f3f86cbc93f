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
