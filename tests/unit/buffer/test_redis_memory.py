"""Redis's memory, on a real redis-server with a maxmemory: the run's Redis never evicts and a Redis that would is
refused; releases pause above the high water and resume below it; a write refused at maxmemory waits (back-pressure)
and then lands once; at maxmemory every write of the buffer happens whole or not at all, and the ones that free
memory (ack, marking a group trained) still work."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from buffer.admission import PromptFeeder
from buffer.memory import EvictingRedis
from buffer.redis_buffer import ReplayBuffer
from fakes.groups import make_group, make_prompt
from sr1.launch.redis_server import LocalRedis
from tests.timing import scaled

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def small_redis(tmp_path_factory):
    with LocalRedis(tmp_path_factory.mktemp("small-redis"), maxmemory_mb=64) as server:
        yield server


@pytest.fixture
def client(small_redis):
    c = redis.Redis.from_url(small_redis.url)
    c.flushall()
    yield c
    c.config_set("maxmemory", str(64 << 20))
    c.config_set("maxmemory-policy", "noeviction")
    c.flushall()
    c.close()


def _buf(url: str, **kw) -> ReplayBuffer:
    return ReplayBuffer(url, "mem", **({"lease_s": 30, "reconnect_s": 0} | kw))


def _squeeze(client: redis.Redis) -> None:
    """Put Redis over its maxmemory: every write Redis counts as growing memory is refused from now on."""
    client.config_set("maxmemory", str(client.info("memory")["used_memory"] // 2))


def _snapshot(client: redis.Redis) -> dict:
    return {key: client.dump(key) for key in sorted(client.keys("mem:*"))}


def test_the_runs_redis_never_evicts_and_a_redis_that_would_is_refused(small_redis, client):
    info = client.info("memory")
    assert info["maxmemory"] == 64 << 20 and info["maxmemory_policy"] == "noeviction"
    memory = _buf(small_redis.url).memory()
    assert memory.maxmemory == 64 << 20 and 0 < memory.fraction < 1
    client.config_set("maxmemory-policy", "allkeys-lru")
    with pytest.raises(EvictingRedis, match="maxmemory-policy allkeys-lru.*noeviction"):
        _buf(small_redis.url)


def test_puts_wait_halfway_between_the_high_water_and_full(small_redis, client):
    buf = _buf(small_redis.url, memory_high_water=0.8)
    used = client.info("memory")["used_memory"]
    client.config_set("maxmemory", str(int(used / 0.85)))  # releases pause (80 %), puts go on (below 90 %)
    assert buf.release_pause_reason() is not None and buf.put_pause_reason() is None
    client.config_set("maxmemory", str(int(used / 0.95)))
    assert "above 90%" in buf.put_pause_reason()
    with pytest.raises(redis.exceptions.OutOfMemoryError, match="the put waits"):
        buf.put_group(make_group(make_prompt(0), n=2, response_len=10))  # reconnect_s 0: gives up at once


def test_releases_pause_above_the_high_water_and_resume_below_it(small_redis, client, caplog):
    buf = _buf(small_redis.url, memory_high_water=0.9)
    feeder = PromptFeeder(buf, [make_prompt(i) for i in range(20)], groups_per_step=2, max_staleness=1)
    used = client.info("memory")["used_memory"]
    client.config_set("maxmemory", str(int(used / 0.95)))  # 95 % full: above the high water, below the limit
    assert feeder.pump() == 0 and "above buffer.memory_high_water (90%)" in feeder.paused
    assert "releases paused" in caplog.text
    stats = buf.stats()
    assert stats["buffer/memory_paused"] == 1 and stats["buffer/redis_maxmemory_mb"] > 0
    client.config_set("maxmemory", str(64 << 20))
    assert feeder.pump() == 4 and feeder.paused is None
    assert buf.stats()["buffer/memory_paused"] == 0


@pytest.mark.parametrize("refused_by", ["the buffer", "redis"])
def test_a_put_at_maxmemory_waits_and_then_lands_once(small_redis, client, refused_by, monkeypatch):
    """The buffer holds a put back while Redis is nearly full; a Redis that refuses it anyway (the buffer could not
    tell: a maxmemory lowered under the run) refuses it whole, and the put is retried the same way."""
    direct = _buf(small_redis.url)
    direct.release_prompts([make_prompt(0)])
    (claim,) = direct.claim_prompts("gen-0", 1)
    generator = _buf(small_redis.url, reconnect_s=30)
    if refused_by == "redis":
        monkeypatch.setattr(generator, "put_pause_reason", lambda *_: None)
    _squeeze(client)
    out: list = []
    put = threading.Thread(
        target=lambda: out.append(
            generator.put_group(make_group(claim.prompt, n=2, response_len=50), claim.entry_id)
        )
    )
    put.start()
    time.sleep(1.0)
    assert put.is_alive() and generator.reconnects.oom >= 1  # refused, backing off
    assert client.xlen("mem:groups") == 0  # nothing half-written meanwhile
    client.config_set("maxmemory", str(64 << 20))  # the learner trained what was queued: memory is back
    put.join(scaled(30))
    assert out == [True]
    assert [t.group.group_id for t in direct.take(5, block_ms=0)] == [claim.prompt.group_id]
    assert direct.stats()["buffer/produced"] == 1


def test_every_write_at_maxmemory_is_whole_or_refused_whole_and_freeing_ones_still_work(small_redis, client):
    buf = _buf(small_redis.url)
    buf.release_prompts([make_prompt(i) for i in range(6)])
    claims = buf.claim_prompts("gen-0", 6)
    for c in claims[:4]:
        buf.put_group(make_group(c.prompt, n=2, response_len=50), c.entry_id)
    taken = buf.take(4, block_ms=0)
    buf.mark_trained([taken[0].entry_id])
    buf._redis.xadd("mem:groups", {"gid": "stray/0/e0", "d": b"\x00 garbage"})  # for a dead letter
    big = ReplayBuffer(small_redis.url, "mem", max_payload_bytes=100, reconnect_s=0)
    _squeeze(client)

    refused = {
        "release": lambda: buf.release_prompts([make_prompt(9)]),
        "put": lambda: buf.put_group(make_group(claims[4].prompt, n=2, response_len=50), claims[4].entry_id),
        "put oversized": lambda: big.put_group(
            make_group(claims[5].prompt, n=2, response_len=50), claims[5].entry_id
        ),
        "dead letter": lambda: buf.take(5, block_ms=0),
        "publish version": lambda: buf.publish_version(1),
        "record staleness": lambda: buf.record_consumed([0, 1]),
        "request evaluation": lambda: buf.request_evaluation(step=1, version=1),
        "heartbeat": lambda: buf.heartbeat("gen-0", "generator", {}),
        "drop": lambda: buf.drop([taken[3].entry_id]),
    }
    for name, write in refused.items():
        before = _snapshot(client)
        try:
            write()
        except redis.exceptions.OutOfMemoryError:
            assert _snapshot(client) == before, f"{name}: refused, but Redis changed"
            continue
        # allowed: Redis lets a script finish once it wrote (XACK first); then it must have done all of it
        assert name in ("dead letter", "drop"), f"{name} was not refused at maxmemory"
    counters = {k.decode(): int(v) for k, v in client.hgetall("mem:counters").items()}
    assert counters.get("dropped", 0) in (0, 1) and counters.get("malformed", 0) in (0, 1)
    if counters.get("malformed"):
        assert counters.get("abandoned", 0) == 0 and len(buf.dead_letters()) == 1  # a stray: not in flight

    # what frees memory works at maxmemory: the learner marks what it trained and acks it
    buf.mark_trained([taken[1].entry_id])
    buf.ack([taken[0].entry_id, taken[1].entry_id])
    stats = buf.stats()
    assert stats["buffer/consumed"] == 2 + counters.get("dropped", 0) and stats["buffer/trained_unacked"] == 0
