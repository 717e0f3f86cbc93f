"""A Redis that listens beyond loopback (`sr1 launch`) has a per-run password: an ACL user allowed sr1's commands on
the run's keys only; clients without it are refused; passwords in URLs and `rediss://` (TLS) work for every client;
secrets are written owner-only and never shown."""

from __future__ import annotations

import stat
import subprocess
import time

import pytest
import redis

from buffer.connection import mask_url
from buffer.redis_buffer import ReplayBuffer
from config import load_config, save_job, secret_env
from fakes.groups import make_group, make_prompt
from sr1.launch.cluster import reachable_redis_command
from sr1.launch.redis_server import LocalRedis, find_redis_server
from sr1.launch.supervisor import Child
from tests.timing import scaled
from weight_sync.rendezvous import Rendezvous

PASSWORD = "s3cret-run-password"


def _owner_only(path) -> bool:
    return stat.S_IMODE(path.stat().st_mode) == 0o600


def exercise_sr1_commands(url: str, namespace: str) -> None:
    """What sr1's parts do with Redis during a run: prompts, leases and their reclaim, groups, acks, heartbeats,
    stats, evaluations and the weight-sync rendezvous (Lua scripts included)."""
    buf = ReplayBuffer(url, namespace, lease_s=0.05, reconnect_s=0)
    buf.release_prompts([make_prompt(i) for i in range(4)], positions=range(4))
    buf.claim_prompts("gen-0", 2)
    time.sleep(0.1)
    claimed = buf.claim_prompts("gen-1", 4)  # gen-0's two leases expired: reclaimed, and two new prompts
    assert len({c.prompt.group_id for c in claimed}) == 4
    for c in claimed[:3]:
        buf.put_group(make_group(c.prompt, n=2, response_len=8), c.entry_id)
    taken = buf.take(3, block_ms=0)
    buf.mark_trained([t.entry_id for t in taken[:2]])
    buf.ack([t.entry_id for t in taken[:2]])
    buf.dead_letter_taken(taken[2], "untrainable here")  # lost work: dead-lettered, counted, replaced
    buf.fail_prompt("gen-1", claimed[3].entry_id, "engine error")
    assert buf.replaced_count() == 1 and buf.dead_letters()
    buf.publish_version(1)
    buf.record_consumed([0, 1])  # the staleness histogram, guarded against a resent record
    buf.forget_ids(position=4, version=1)  # after a checkpoint: the ids below the watermark leave Redis
    assert not buf.put_group(taken[0].group)  # a late copy, recognised by the watermark: a duplicate
    buf.heartbeat("gen-0", "generator", {"rollout/groups_done": 3})
    assert buf.version() == 1 and [w["worker_id"] for w in buf.workers()] == ["gen-0"]
    assert buf.stats()["buffer/consumed"] == 2
    eval_id = buf.request_evaluation(step=1, version=1, shards=1)
    buf.post_evaluation_answer(buf.pop_evaluation_request("gen-0"), {"eval/em": 0.5})
    assert buf.evaluation_answers(eval_id) == [{"eval/em": 0.5}]
    buf.close()
    rv = Rendezvous(url, namespace, reconnect_s=0)
    epoch = rv.next_epoch()
    cursor = rv.event_cursor()
    rv.publish({"addr": "127.0.0.1", "port": 1, "backend": "gloo", "epoch": epoch, "timeout_s": 5})
    rv.wait_for_event(cursor, 0.1)
    rv.announce_engine("gen-0")
    assert rv.claim_rank(epoch, "gen-0") == 1 and rv.live_engines() == {"gen-0"}
    rv.announce_update({"version": 1, "epoch": epoch, "buckets": [], "dtype": "float32"})
    rv.ack_update(1, "gen-0")
    rv.wait_acks(1, 1, timeout_s=scaled(2), expected=rv.members(epoch))
    rv.publish({"addr": "127.0.0.1", "port": 1, "backend": "gloo", "epoch": rv.next_epoch(), "timeout_s": 5})
    rv.close()


@pytest.fixture
def protected(tmp_path):
    server = LocalRedis(tmp_path / "redis", password=PASSWORD, namespace="run1").start()
    yield server
    server.stop()


def test_a_client_without_the_password_is_refused(protected):
    for client in (
        redis.Redis(port=protected.port),
        redis.Redis.from_url(f"redis://sr1:wrong@127.0.0.1:{protected.port}/0"),
    ):
        with pytest.raises(redis.AuthenticationError):
            client.get("run1:version")
    assert redis.Redis.from_url(protected.url).ping()


def test_the_run_user_runs_sr1_and_nothing_else(protected):
    exercise_sr1_commands(protected.url, "run1")
    client = redis.Redis.from_url(protected.url)
    for forbidden in (
        lambda: client.flushall(),
        lambda: client.config_get("*"),
        lambda: client.keys("*"),
        lambda: client.get("another-run:version"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            forbidden()


def test_secrets_are_owner_only_and_the_acl_file_holds_no_password(protected, tmp_path):
    assert _owner_only(protected.url_file) and _owner_only(protected.acl_file)
    assert PASSWORD in protected.url_file.read_text() and PASSWORD not in protected.acl_file.read_text()
    assert PASSWORD not in " ".join(protected.command())  # `ps` shows command lines
    cfg = load_config("tiny", [f"buffer.redis_url={protected.url}", "retrieval.token=tok"])
    job = save_job(cfg.generator_job(), tmp_path / "jobs" / "gen-0.yaml")
    # the job file holds it masked: the worker gets it in its environment (config/secret_env.py)
    assert _owner_only(job) and PASSWORD not in job.read_text()
    assert secret_env(cfg.generator_job())["SR1_BUFFER__REDIS_URL"] == protected.url


def test_urls_are_masked_where_shown():
    assert mask_url("redis://sr1:pw@10.0.0.1:6379/0") == "redis://sr1:***@10.0.0.1:6379/0"
    assert (
        mask_url("rediss://:pw@host:6380/2?ssl_ca_certs=/ca.pem")
        == "rediss://:***@host:6380/2?ssl_ca_certs=/ca.pem"
    )
    assert mask_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


@pytest.fixture
def netns_host():
    """A test host of our own: a network namespace joined to this one by a veth pair, with addresses on both ends.
    Yields (namespace, the host's address, this side's address); a server started in the namespace is reached at
    the host's address, beyond this namespace's loopback, and traffic never leaves the machine. Skipped where
    namespaces cannot be made (not root, no iproute2)."""
    import os
    import shutil

    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    suffix = os.getpid() % 10000
    ns, outside, inside = f"sr1-redis-{suffix}", f"sr1o{suffix}", f"sr1i{suffix}"
    host_ip, our_ip = f"10.213.{suffix % 250}.2", f"10.213.{suffix % 250}.1"

    def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=check)

    try:
        ip("netns", "add", ns)
        ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        ip("link", "set", inside, "netns", ns)
        ip("addr", "add", f"{our_ip}/30", "dev", outside)
        ip("link", "set", outside, "up")
        ip("netns", "exec", ns, "ip", "addr", "add", f"{host_ip}/30", "dev", inside)
        ip("netns", "exec", ns, "ip", "link", "set", inside, "up")
        ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
    except subprocess.CalledProcessError as e:
        ip("link", "del", outside, check=False)
        ip("netns", "del", ns, check=False)
        pytest.skip(f"could not make a network namespace: {e.stderr.strip()}")
    try:
        yield ns, host_ip, our_ip
    finally:
        ip("link", "del", outside, check=False)
        ip("netns", "del", ns, check=False)


def _answers_ping(url: str, child: Child, timeout_s: float = 10.0) -> bool:
    """Whether the server at `url` answers PING before `child` exits or `timeout_s` passes."""
    deadline = time.monotonic() + scaled(timeout_s)
    while child.alive and time.monotonic() < deadline:
        try:
            return bool(redis.Redis.from_url(url).ping())
        except redis.ConnectionError:
            time.sleep(0.05)
    return False


def test_a_redis_reachable_from_other_nodes_needs_the_password(tmp_path, netns_host):
    ns, ip, _ = netns_host
    with pytest.raises(ValueError, match="needs a password"):
        reachable_redis_command(LocalRedis(tmp_path / "open").command(), ip)
    server = LocalRedis(tmp_path / "redis", password=PASSWORD, namespace="run1")
    cmd = reachable_redis_command(server.command(), ip)
    assert cmd[cmd.index("--protected-mode") + 1] == "yes"
    # the server runs on the test host (its own network namespace) and is reached from here over the veth pair
    child = Child("redis", ["ip", "netns", "exec", ns, *cmd], tmp_path / "redis.stdout.log").start()
    try:
        url = server.url_on(ip)
        assert _answers_ping(url, child), (tmp_path / "redis.stdout.log").read_text()[-300:]
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host=ip, port=server.port).get("run1:version")
        exercise_sr1_commands(url, "run1")
    finally:
        child.stop(grace_s=5.0)


def _tls_files(tmp_path):
    """A CA and a server certificate for 127.0.0.1 (openssl)."""

    def run(*args):
        subprocess.run(["openssl", *args], cwd=tmp_path, check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=sr1-test-ca",
    )
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    )
    (tmp_path / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "1",
        "-extfile",
        "san.ext",
    )
    return tmp_path / "ca.pem", tmp_path / "server.pem", tmp_path / "server.key"


def test_rediss_urls_reach_a_tls_redis(tmp_path, free_port):
    try:
        ca, cert, key = _tls_files(tmp_path)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("openssl cannot make a test certificate here")
    cmd = [
        find_redis_server(),
        "--port",
        "0",
        "--tls-port",
        str(free_port),
        "--bind",
        "127.0.0.1",
        "--tls-cert-file",
        str(cert),
        "--tls-key-file",
        str(key),
        "--tls-ca-cert-file",
        str(ca),
        "--tls-auth-clients",
        "no",
        "--requirepass",
        PASSWORD,
        "--save",
        "",
        "--dir",
        str(tmp_path),
    ]
    child = Child("redis-tls", cmd, tmp_path / "redis.log").start()
    try:
        url = f"rediss://:{PASSWORD}@127.0.0.1:{free_port}/0?ssl_ca_certs={ca}"
        if not _answers_ping(url, child):
            pytest.skip("this redis-server has no TLS: " + (tmp_path / "redis.log").read_text()[-300:])
        exercise_sr1_commands(url, "tls")
    finally:
        child.stop(grace_s=5.0)


def test_launch_turns_the_retrieval_token_on():
    from types import SimpleNamespace

    from sr1.launch.cluster import ClusterOrchestrator

    slot = SimpleNamespace(ip="10.0.0.7")
    launcher = SimpleNamespace(
        supervisor=SimpleNamespace(slots=lambda pool: [slot], free_port=lambda s: 8123)
    )
    cfg = ClusterOrchestrator._place_retrieval(launcher, load_config("tiny"))
    assert cfg.retrieval.client.url == "http://10.0.0.7:8123/retrieve" and len(cfg.retrieval.token) >= 32
    assert (cfg.retrieval.server.host, cfg.retrieval.server.port) == ("10.0.0.7", 8123)
    assert cfg.generator_job().retrieval.token == cfg.retrieval.token  # the generators' client sends it
    given = ClusterOrchestrator._place_retrieval(launcher, load_config("tiny", ["retrieval.token=mine"]))
    assert given.retrieval.token == "mine"
