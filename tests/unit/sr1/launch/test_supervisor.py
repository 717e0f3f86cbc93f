"""The supervisor: restarts with back-off, gives up naming the process and its log, restarts gangs together,
stops whole process groups, and its children die with it; the run lock names its owner and outlives no process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from config import EXIT_BAD_INPUT
from sr1.launch.lock import RunLock, RunLocked
from sr1.launch.supervisor import Child, ChildFailed, RestartPolicy, Supervisor
from tests.timing import scaled


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _running(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def _until(predicate, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + scaled(timeout_s)
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_a_dead_child_is_restarted_with_backoff_then_given_up_on(tmp_path):
    sup = Supervisor()
    child = sup.start(
        Child(
            "crasher",
            _py("import sys; print('boom'); sys.exit(3)"),
            tmp_path / "c.log",
            restart=RestartPolicy(max_restarts=2, backoff_s=0.2, window_s=60),
        )
    )
    restarted = []
    with pytest.raises(ChildFailed, match=r"(?s)crasher died 3 times within 60s.*exited with code 3.*boom"):
        deadline = time.monotonic() + scaled(20)
        while time.monotonic() < deadline:
            restarted += sup.check()
            time.sleep(0.05)
    assert len(restarted) == 2 and len(child.restarts) == 2
    assert child.restarts[1] - child.restarts[0] >= 0.35  # the back-off doubled: 0.2 s, then 0.4 s
    assert [e.kind for e in sup.events] == ["died", "restarted", "died", "restarted", "died"]


def test_a_child_without_a_policy_fails_the_run_and_one_that_finished_is_left_alone(tmp_path):
    sup = Supervisor()
    sup.start(Child("done", _py("pass"), tmp_path / "d.log"))
    _until(lambda: sup.children[0].returncode == 0)
    assert sup.check() == []
    sup.start(Child("broken", _py("import sys; sys.exit(5)"), tmp_path / "b.log"))
    _until(lambda: sup.children[1].returncode is not None)
    with pytest.raises(ChildFailed, match="broken exited with code 5"):
        sup.check()


def test_a_configuration_or_data_error_is_not_restarted_but_a_crash_is(tmp_path):
    sup = Supervisor()
    policy = RestartPolicy(max_restarts=5, backoff_s=0.05, window_s=60)
    crash = sup.start(Child("crash", _py("import os; os.abort()"), tmp_path / "c.log", restart=policy))
    _until(lambda: crash.returncode is not None)
    _until(lambda: bool(sup.check()))  # the crash (SIGABRT) is restarted
    assert len(crash.restarts) == 1
    crash.stop(grace_s=0.0, first=signal.SIGKILL)
    sup.children.remove(crash)
    code = f"import sys; print('learner.lr: must be a finite number'); sys.exit({EXIT_BAD_INPUT})"
    bad = sup.start(Child("learner", _py(code), tmp_path / "l.log", restart=policy))
    _until(lambda: bad.returncode is not None)
    with pytest.raises(
        ChildFailed, match=r"(?s)learner stopped on a configuration or data error.*finite"
    ) as err:
        sup.check()
    assert err.value.exit_code == EXIT_BAD_INPUT and bad.restarts == []


def test_a_gang_restarts_together(tmp_path):
    sup = Supervisor()
    policy = RestartPolicy(backoff_s=0.1)
    a = sup.start(
        Child("rank-0", _py("import time; time.sleep(60)"), tmp_path / "a.log", restart=policy, gang="g")
    )
    b = sup.start(
        Child("rank-1", _py("import time; time.sleep(60)"), tmp_path / "b.log", restart=policy, gang="g")
    )
    first_a, first_b = a.pid, b.pid
    os.kill(first_b, signal.SIGKILL)
    _until(lambda: b.returncode is not None)
    _until(lambda: (sup.check() or True) and a.pid != first_a and b.pid != first_b and a.alive and b.alive)
    sup.stop()


def test_stop_kills_the_whole_group_even_after_its_leader_exited(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    # the leader starts a grandchild in its own group and exits at once
    code = (
        "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))"
    )
    child = Child("leader", _py(code), tmp_path / "l.log").start()
    _until(lambda: pid_file.exists() and pid_file.read_text() and child.returncode is not None)
    grandchild = int(pid_file.read_text())
    assert child.group_alive()
    child.stop(grace_s=1.0)
    _until(lambda: not child.group_alive())
    with pytest.raises(ProcessLookupError):
        os.kill(grandchild, 0)


def test_children_die_with_their_parent(tmp_path):
    pid_file = tmp_path / "child.pid"
    code = (
        "from pathlib import Path; import sys, time; from sr1.launch.supervisor import Child; "
        "c = Child('sleeper', [sys.executable, '-c', 'import time; time.sleep(60)']).start(); "
        f"Path({str(pid_file)!r}).write_text(str(c.pid)); time.sleep(60)"
    )
    parent = subprocess.Popen(_py(code), cwd=os.getcwd())
    _until(lambda: pid_file.exists() and pid_file.read_text())
    child = int(pid_file.read_text())
    parent.kill()
    parent.wait()
    _until(lambda: not _running(child))


def test_a_child_started_with_sigint_blocked_still_stops_on_sigint(tmp_path):
    """A Ray actor blocks SIGINT and its children inherit the mask: the supervisor clears it, so Ctrl-C reaches them."""
    code = "import signal, time; signal.signal(signal.SIGINT, lambda *a: print('got SIGINT', flush=True) or exit(0)); time.sleep(60)"
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        child = Child("blocked", _py(code), tmp_path / "b.log").start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    _until(lambda: Path(f"/proc/{child.pid}/status").exists())
    blocked = next(
        line
        for line in Path(f"/proc/{child.pid}/status").read_text().splitlines()
        if line.startswith("SigBlk:")
    )
    assert int(blocked.split()[1], 16) & (1 << (signal.SIGINT - 1)) == 0
    time.sleep(scaled(1.0))  # its handler is installed
    assert child.stop(grace_s=10.0) == 0
    assert "got SIGINT" in (tmp_path / "b.log").read_text()


def test_the_run_lock_names_its_live_owner_and_is_held_by_its_children(tmp_path):
    lock = RunLock(tmp_path, "sr1 run").acquire()
    with pytest.raises(RunLocked, match=rf"in use by sr1 run \(pid {os.getpid()}"):
        RunLock(tmp_path, "sr1 run").acquire(wait_for_dead_owner_s=0)
    # a child that inherited the locked descriptor keeps the directory locked after its parent let go
    child = Child("holder", _py("import time; time.sleep(60)"), pass_fds=(lock.fd,)).start()
    os.close(lock.fd)  # what the parent's death does to its descriptor
    lock._fd = None
    with pytest.raises(RunLocked):
        RunLock(tmp_path, "again").acquire(wait_for_dead_owner_s=0)
    child.stop(grace_s=0.0, first=signal.SIGKILL)
    RunLock(tmp_path, "again").acquire(
        wait_for_dead_owner_s=0
    ).release()  # the last holder is gone: taken over


def test_a_lock_whose_owner_died_is_taken_over(tmp_path):
    code = (
        f"from sr1.launch.lock import RunLock; RunLock({str(tmp_path)!r}, 'sr1 run').acquire(); "
        "import os; os._exit(0)"
    )
    subprocess.run(_py(code), check=True)
    RunLock(tmp_path, "sr1 run").acquire(wait_for_dead_owner_s=0).release()


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores"
)
def test_a_pinned_child_and_its_children_run_on_its_cores_only(tmp_path):
    core = min(os.sched_getaffinity(0))
    code = (
        "import os, subprocess, sys; print(sorted(os.sched_getaffinity(0)));"
        "print(subprocess.check_output([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'],"
        " text=True).strip())"
    )
    child = Child("pinned", _py(code), tmp_path / "p.log", cpus=(core,)).start()
    assert child.process.wait(timeout=scaled(30)) == 0
    assert (tmp_path / "p.log").read_text().split("\n")[:2] == [f"[{core}]", f"[{core}]"]


def test_pools_pin_their_children_to_the_configured_cores(tmp_path):
    from config import load_config
    from sr1.launch.pools import generator_children, learner_children

    cfg = load_config(
        "tiny",
        [
            f"run_dir={tmp_path}",
            "model.path=/nonexistent",
            "generators.cpu_cores=[0]",
            "learner.cpu_cores=[1]",
        ],
    )
    (gen,) = generator_children(cfg, 1, "g")
    (rank,) = learner_children(cfg, resume=False)
    assert gen.cpus == (0,) and gen.env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert rank.cpus == (1,)
    unpinned = load_config("tiny", [f"run_dir={tmp_path}", "model.path=/nonexistent"])
    assert generator_children(unpinned, 1, "g")[0].cpus is None
