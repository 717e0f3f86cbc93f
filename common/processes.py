"""A child process that dies with its parent: what every process sr1 starts asks of the kernel.

    subprocess.run(cmd, preexec_fn=die_with_parent)     # the child gets SIGKILL when this process dies (Linux)

Without it a SIGKILLed parent (a chaos kill, an OOM kill, a test's timeout) leaves its children running as orphans: a
tiny-world build, a vLLM engine core, a pool member. Elsewhere than Linux it does nothing.
"""

from __future__ import annotations

import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1
try:  # loaded here, not in the forked child (loading a library between fork and exec can deadlock)
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - not a POSIX libc
    _LIBC = None


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """In a child before exec, or in a process just started (Linux): the kernel sends `sig` when the parent dies.

    "The parent" is the thread that started the child: a child started from a short-lived thread dies when that
    thread ends."""
    prctl = getattr(_LIBC, "prctl", None) if sys.platform.startswith("linux") else None
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, sig)
