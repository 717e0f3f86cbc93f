"""One run, one owner: an exclusive lock on a run directory, naming its owner.

    with RunLock(run_dir, "sr1 run"):        # raises RunLocked naming the live owner (host, pid, command, since)
        ...

The lock is a `flock` on `<run_dir>/<name>`, held by the launcher for its whole life; the launcher hands the
locked descriptor to the processes it starts (`fd`), so the directory stays locked until the last of them is gone.
The kernel releases it when they have all died, however they died: a lock left by killed processes is taken over at
once (a launcher finding the recorded owner dead waits a little for its last children), and the file's contents
(the owner, with its command line masked by common/secrets.py; readable by its owner only) are rewritten. Two stacks
on one run directory would otherwise run two Redis servers on the same AOF and two learners writing the same
checkpoints.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from common.secrets import mask_argv

OWNER_LOCK = ".sr1-owner.lock"  # held by the launcher of a run (`sr1 run`, `sr1 learner`)


class RunLocked(RuntimeError):
    """Another live process owns the run directory."""


class RunLock:
    def __init__(self, run_dir: Path | str, role: str, name: str = OWNER_LOCK):
        self.path = Path(run_dir) / name
        self.role = role
        self._fd: int | None = None

    @property
    def fd(self) -> int | None:
        """The locked descriptor (hand it to child processes: the lock is held while any of them lives)."""
        return self._fd

    def acquire(self, wait_for_dead_owner_s: float = 60.0) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        os.fchmod(fd, 0o600)  # a lock file an older sr1 made 0644 is closed up too
        deadline = time.monotonic() + wait_for_dead_owner_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                owner = _read(fd)
                if not _alive(owner) and time.monotonic() < deadline:
                    time.sleep(0.5)  # the owner died; its last children are exiting (they hold the lock)
                    continue
                os.close(fd)
                raise RunLocked(
                    f"{self.path.parent} is in use by {owner.get('role', 'another process')} (pid {owner.get('pid', '?')} "
                    f"on {owner.get('host', '?')}, since {owner.get('since', '?')}: {owner.get('command', '?')}); "
                    "stop it first, or use another run directory"
                ) from None
        os.ftruncate(fd, 0)
        body = {
            "role": self.role,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(mask_argv(sys.argv)),  # a command line may hold a password or a token
        }
        os.pwrite(fd, json.dumps(body).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _alive(owner: dict) -> bool:
    """Whether the recorded owner process still runs (assumed so when it is on another host)."""
    if owner.get("host") != socket.gethostname() or not isinstance(owner.get("pid"), int):
        return True
    try:
        os.kill(owner["pid"], 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _read(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        return {}
