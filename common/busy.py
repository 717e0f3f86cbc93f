"""A process says it is busy with work a stop must not cut short, in a small file its supervisor reads: the learner
while it writes a checkpoint (`CHECKPOINTING` in the run directory), which `sr1 run` waits for past the learner's
stop grace (sr1/launch/supervisor.py) instead of killing the learner in the middle of its last checkpoint.

    mark_busy(run_dir / CHECKPOINTING, "checkpoint step_12")     # the learner's rank 0, before it writes
    clear_busy(run_dir / CHECKPOINTING)                          # after (written or failed)
    busy_with(run_dir / CHECKPOINTING)   # the supervisor: "checkpoint step_12 (pid 4242, for 41 s)", or None

A marker left behind by a process that died says nothing: `busy_with` checks that its writer still runs.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

CHECKPOINTING = ".sr1-checkpointing"  # in the run directory, while the learner writes a checkpoint


def mark_busy(path: Path, what: str) -> None:
    """Say that this process is busy with `what` (replaces any earlier marker at `path`)."""
    body = {"what": what, "pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body))
    tmp.replace(path)  # readers see the old marker or the new one, never half of one


def clear_busy(path: Path) -> None:
    """This process is no longer busy (nothing happens when there is no marker)."""
    path.unlink(missing_ok=True)


def busy_with(path: Path) -> str | None:
    """What the writer of the marker at `path` is busy with, and since when; None without a marker, with one that
    cannot be read, or with one whose writer no longer runs (on this host; one on another host is believed)."""
    try:
        body = json.loads(path.read_text())
        what, pid, host, since = body["what"], int(body["pid"]), body["host"], float(body["since"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if host == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # another user's process: it runs
    return f"{what} (pid {pid}, for {time.time() - since:.0f} s)"
