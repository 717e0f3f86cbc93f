"""The run lock names its owner without its secrets: created owner-only, its command line masked."""

from __future__ import annotations

import json
import stat
import sys

from sr1.launch.lock import OWNER_LOCK, RunLock


def test_the_lock_file_is_private_and_its_command_line_masked(tmp_path, monkeypatch):
    argv = ["sr1", "run", "--redis-url", "redis://sr1:pa55word@10.0.0.5:6379/0", "retrieval.token=t0k3n"]
    monkeypatch.setattr(sys, "argv", argv)
    old = tmp_path / OWNER_LOCK
    old.write_text("{}")
    old.chmod(0o644)  # left by an older sr1
    lock = RunLock(tmp_path, "sr1 run").acquire()
    try:
        assert stat.S_IMODE(old.stat().st_mode) == 0o600
        text = old.read_text()
        assert "pa55word" not in text and "t0k3n" not in text
        assert json.loads(text)["command"] == (
            "sr1 run --redis-url redis://sr1:***@10.0.0.5:6379/0 retrieval.token=***"
        )
    finally:
        lock.release()
    fresh = tmp_path / "fresh"
    RunLock(fresh, "sr1 learner").acquire().release()
    assert stat.S_IMODE((fresh / OWNER_LOCK).stat().st_mode) == 0o600
