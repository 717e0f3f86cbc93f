"""A real retrieval server process for tests and benchmarks: `python -m sr1.entrypoints.retrieval serve ...`, started and stopped.

proc, url = start_server(["--method", "bm25", "--corpus", "corpus.jsonl"])
...  # POST url
stop_server(proc)
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: the server runs this checkout's code


def start_server(
    args: list[str], port: int | None = None, timeout_s: float = 60.0
) -> tuple[subprocess.Popen, str]:
    """Start a server with the `serve` arguments `args` on `port` (a free one when None); returns the process
    and its `/retrieve` URL once it printed its listening line. Raises with the server's output if it exits or does
    not start within `timeout_s`. Its later output is drained in the background (the last lines kept on
    `proc.output_tail`), so a chatty server never blocks on a full pipe."""
    if port is None:
        from sr1.launch.supervisor import free_port

        port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sr1.entrypoints.retrieval", "serve", "--port", str(port), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + timeout_s
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise RuntimeError(f"retrieval server exited with {proc.returncode}:\n{''.join(lines)}")
        lines.append(line)
        if "listening on" in line:
            if f"http://127.0.0.1:{port}" not in line:
                stop_server(proc)
                raise RuntimeError(f"retrieval server is not listening on 127.0.0.1:{port}: {line.strip()}")
            break
    else:
        stop_server(proc)
        raise RuntimeError(f"retrieval server did not start within {timeout_s:.0f} s:\n{''.join(lines)}")
    tail: collections.deque[str] = collections.deque(lines[-50:], maxlen=200)
    proc.output_tail = tail  # type: ignore[attr-defined]
    threading.Thread(target=lambda: tail.extend(proc.stdout), daemon=True, name="retrieval-output").start()
    return proc, f"http://127.0.0.1:{port}/retrieve"


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
