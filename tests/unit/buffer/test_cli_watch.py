"""`sr1 buffer watch`'s worker lines: who joined, changed state or left, between two looks at the heartbeats."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from buffer.cli import worker_events, worker_states
from buffer.redis_buffer import ReplayBuffer
from tests.timing import scaled


def _beat(worker_id: str, role: str = "generator", state: str | None = None) -> dict:
    return {"worker_id": worker_id, "role": role, "metrics": {"rollout/state": state} if state else {}}


def test_joins_state_changes_and_departures_are_named():
    before = worker_states([_beat("gen-0", state="running"), _beat("learner-0", "learner")])
    now = worker_states([_beat("gen-0", state="stopped"), _beat("gen-1", state="running")])
    assert worker_events(before, now) == [
        "~ gen-0 (generator) stopped",
        "+ gen-1 (generator) joined, running",
        "- learner-0 (learner) left (last seen running; no heartbeat within the TTL)",
    ]
    assert worker_events(now, now) == []


def test_watch_in_a_pipe_prints_workers_as_they_come_and_go(redis_url):
    buf = ReplayBuffer(redis_url, "watch-lines", heartbeat_ttl_s=2.0)
    alive = {"gen-0"}
    stop = threading.Event()

    def beat() -> None:  # the workers in `alive` heartbeat, as live ones do
        while not stop.wait(0.2):
            for worker_id in list(alive):
                buf.heartbeat(worker_id, "generator", {"rollout/state": "running"})

    beating = threading.Thread(target=beat, daemon=True)
    beating.start()
    cmd = [
        sys.executable,
        "-m",
        "sr1",
        "buffer",
        "watch",
        "--url",
        redis_url,
        "--namespace",
        "watch-lines",
        "--interval",
        "0.2",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def read_until(text: str) -> None:
        deadline = time.monotonic() + scaled(60)  # a line comes at least every 10 s (the summary)
        while not any(text in line for line in lines) and time.monotonic() < deadline:
            lines.append(proc.stdout.readline())
            assert lines[-1] or proc.poll() is None, "".join(lines)

    try:
        read_until("+ gen-0 (generator) joined, running")
        alive.add("gen-1")
        read_until("+ gen-1 (generator) joined, running")
        alive.discard("gen-0")  # gen-0 dies: its heartbeat expires
        read_until("- gen-0 (generator) left")
    finally:
        stop.set()
        beating.join()
        proc.kill()
        proc.wait()
        buf.close()
    text = "".join(lines)
    for event in ("+ gen-0 (generator) joined", "+ gen-1 (generator) joined", "- gen-0 (generator) left"):
        assert event in text, text
    assert "- gen-1" not in text
