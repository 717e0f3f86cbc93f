"""A child started with `die_with_parent` goes when its parent is SIGKILLed; one started without it stays an orphan."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    from common.processes import die_with_parent
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             preexec_fn=die_with_parent if sys.argv[1] == "tied" else None)
    print(child.pid, flush=True)
    time.sleep(60)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie waiting for its reaper is gone too
        return stat.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.slow
@pytest.mark.parametrize("tied", [True, False])
def test_a_child_dies_with_its_killed_parent_only_when_tied(tied):
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, "tied" if tied else "free"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    child = int(parent.stdout.readline())
    try:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        # tied: a hang guard for the death (scaled); free: the child must outlive this fixed 10 s window
        deadline = time.monotonic() + (scaled(10) if tied else 10)
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(child) is not tied
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
