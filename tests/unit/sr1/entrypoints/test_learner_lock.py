"""One learner per run (issue #49): the learner's entry point takes the run directory's owner lock, as the launchers
do, unless the launcher that started it holds it; a second learner on a run directory stops at once, naming the
owner, before it reads a prompt or joins a process group."""

from __future__ import annotations

import json
import os
import socket

import pytest

from common.launcher import LAUNCHER_ENV, launcher_owner
from sr1.entrypoints.learner import main, take_run_lock
from sr1.launch.lock import OWNER_LOCK, RunLock, RunLocked


def test_a_second_learner_on_a_run_stops_at_once_naming_the_owner(tmp_path, monkeypatch, capsys):
    from config import EXIT_BAD_INPUT

    monkeypatch.delenv(LAUNCHER_ENV, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    owner = RunLock(tmp_path, "sr1 run").acquire()  # the first stack (or learner) on this run directory
    try:
        argv = ["--config", "tiny", "--redis-url", "redis://127.0.0.1:1/0", f"run_dir={tmp_path}"]
        assert main(argv) == EXIT_BAD_INPUT
    finally:
        owner.release()
    err = capsys.readouterr().err
    assert f"{tmp_path} is in use by sr1 run (pid {os.getpid()}" in err and "stop it first" in err


def test_a_learner_started_by_the_lock_holder_takes_no_lock_of_its_own(tmp_path, monkeypatch):
    owner = RunLock(tmp_path, "sr1 run").acquire()
    try:
        monkeypatch.setenv(LAUNCHER_ENV, launcher_owner())  # as sr1/launch/pools.py's learner_children set it
        assert take_run_lock(tmp_path) is None
        monkeypatch.setenv(LAUNCHER_ENV, f"{socket.gethostname()}:{os.getpid() + 1}")  # another launcher's
        with pytest.raises(RunLocked, match="in use by sr1 run"):
            take_run_lock(tmp_path)
    finally:
        owner.release()


def test_a_learner_alone_holds_the_lock_while_it_lives(tmp_path, monkeypatch):
    monkeypatch.delenv(LAUNCHER_ENV, raising=False)
    lock = take_run_lock(tmp_path)
    try:
        assert lock is not None
        record = json.loads((tmp_path / OWNER_LOCK).read_text())
        assert record["role"] == "learner" and record["pid"] == os.getpid()
        with pytest.raises(RunLocked, match=rf"in use by learner \(pid {os.getpid()}"):
            RunLock(tmp_path, "sr1 run").acquire(wait_for_dead_owner_s=0)
    finally:
        lock.release()


def test_the_launchers_name_themselves_to_the_learner_ranks(tmp_path):
    from config import load_config
    from config.environment import config_variables
    from sr1.launch.pools import learner_children

    cfg = load_config("tiny", [f"run_dir={tmp_path}", "learner.num_ranks=2"])
    ranks = learner_children(cfg, resume=False)
    assert [rank.env[LAUNCHER_ENV] for rank in ranks] == [launcher_owner()] * 2
    assert LAUNCHER_ENV not in config_variables(
        ranks[0].env
    )  # sr1's own variable: the learner's config ignores it
