"""Two processes asking for the same tiny world at once (two `sr1 run`s, two test workers): one builds, the other
waits for its lock and then finds the world built."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.timing import scaled
from world import _build_lock

ROOT = Path(__file__).resolve().parents[3]

_HOLDER = """
import sys, time
from pathlib import Path
from world import _build_lock
out = Path(sys.argv[1])
with _build_lock(out, progress=False):
    (out.parent / "held").write_text("")
    time.sleep(1.0)
    (out.parent / "built").write_text("")  # what a build writes before it lets go
"""


def test_a_second_builder_waits_until_the_first_lets_go(tmp_path, capsys):
    out = tmp_path / "seed0"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out)], cwd=ROOT)
    try:
        deadline = time.monotonic() + scaled(60)
        while not (tmp_path / "held").exists():
            assert holder.poll() is None and time.monotonic() < deadline, (
                "the first builder never took the lock"
            )
            time.sleep(0.05)
        with _build_lock(out, progress=True):
            assert (tmp_path / "built").exists()  # not before the first one finished
        assert "another process is building" in capsys.readouterr().out
    finally:
        holder.wait(timeout=scaled(60))
    assert holder.returncode == 0
    with _build_lock(out, progress=True):  # free again: taken at once, nothing said
        pass
    assert capsys.readouterr().out == ""
