"""A stop does not cut a checkpoint short (issue #49): past its grace, the supervisor waits while the child says it is
busy (common/busy.py's marker, which the learner's rank 0 writes while it writes a checkpoint), and kills a child that
says nothing as before. The child here is a real process whose "checkpoint" (3 s) starts when it is asked to stop."""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import sys
import time

from common.busy import busy_with, clear_busy, mark_busy
from sr1.launch.supervisor import Child
from tests.timing import scaled

CHECKPOINT_S = 3.0
GRACE_S = 0.5

# on SIGINT: mark busy, "write the checkpoint", clear the marker, exit 0 (as the learner's last checkpoint does)
CHILD = f"""
import signal, sys, time
from pathlib import Path
sys.path.insert(0, {os.getcwd()!r})
from common.busy import clear_busy, mark_busy
marker = Path(sys.argv[1])
asked = []
signal.signal(signal.SIGINT, lambda *_: asked.append(1))
Path(sys.argv[2]).write_text("ready")
while not asked:
    time.sleep(0.05)
mark_busy(marker, "checkpoint step_7")
time.sleep({CHECKPOINT_S})
clear_busy(marker)
sys.exit(0)
"""


def _child(tmp_path, busy: bool) -> Child:
    marker, ready = tmp_path / "marker", tmp_path / "ready"
    child = Child(
        "learner",
        [sys.executable, "-c", CHILD, str(marker), str(ready)],
        busy=functools.partial(busy_with, marker) if busy else None,
    ).start()
    deadline = time.monotonic() + scaled(30)
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return child


def test_a_stop_waits_past_the_grace_while_the_child_checkpoints(tmp_path):
    child = _child(tmp_path, busy=True)
    started = time.monotonic()
    assert child.stop(grace_s=GRACE_S) == 0  # not SIGTERMed in the middle of its checkpoint
    assert time.monotonic() - started >= CHECKPOINT_S - 0.5
    assert busy_with(tmp_path / "marker") is None


def test_a_child_that_says_nothing_is_stopped_after_its_grace(tmp_path):
    child = _child(tmp_path, busy=False)
    started = time.monotonic()
    assert child.stop(grace_s=GRACE_S) == -signal.SIGTERM
    assert time.monotonic() - started < CHECKPOINT_S


def test_a_marker_says_what_and_since_when_and_nothing_once_its_writer_is_gone(tmp_path):
    marker = tmp_path / "marker"
    assert busy_with(marker) is None
    mark_busy(marker, "checkpoint step_3")
    assert busy_with(marker).startswith(f"checkpoint step_3 (pid {os.getpid()}, for ")
    clear_busy(marker)
    assert busy_with(marker) is None
    dead = {"what": "checkpoint step_4", "pid": 999999999, "host": socket.gethostname(), "since": 0}
    marker.write_text(json.dumps(dead))
    assert busy_with(marker) is None  # its writer died: no reason to wait
    marker.write_text("{not json")
    assert busy_with(marker) is None


def test_the_learner_ranks_are_waited_for_while_rank_0_writes_a_checkpoint(tmp_path):
    from common.busy import CHECKPOINTING
    from config import load_config
    from sr1.launch.pools import learner_children

    cfg = load_config("tiny", [f"run_dir={tmp_path}", "learner.num_ranks=2"])
    ranks = learner_children(cfg, resume=False)
    assert [rank.busy() for rank in ranks] == [None, None]
    mark_busy(tmp_path / CHECKPOINTING, "checkpoint step_5")  # as the learner's StepCoordinator does
    assert all(rank.busy().startswith("checkpoint step_5") for rank in ranks)
