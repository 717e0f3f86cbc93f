"""A buffer reopened after Redis dies (SIGKILL, AOF with appendfsync always) still has its prompts, groups,
pending entries, counters and version; a run's local server publishes its URL in the run directory while it runs."""

from __future__ import annotations

import pytest
import redis

from buffer.redis_buffer import ReplayBuffer
from buffer.settings import local_redis_dir
from fakes.groups import make_group, make_prompt
from sr1.launch.redis_server import LocalRedis


def test_state_survives_a_killed_redis(tmp_path):
    server = LocalRedis(tmp_path / "redis", appendfsync="always").start()
    buf = ReplayBuffer(server.url, "run")
    prompts = [make_prompt(i) for i in range(6)]
    buf.release_prompts(prompts)
    leased = buf.claim_prompts("gen-0", 4)
    for c in leased[:3]:
        buf.put_group(make_group(c.prompt, n=2, response_len=50), c.entry_id)
    taken = buf.take(2, block_ms=0)
    buf.ack([taken[0].entry_id])
    buf.publish_version(3)
    buf.record_consumed([0, 1, 1])
    before = buf.stats()
    buf.close()
    server.kill()  # no shutdown handler: only what the AOF already holds survives

    server = LocalRedis(tmp_path / "redis", appendfsync="always").start()  # same AOF, a new port
    try:
        buf = ReplayBuffer(server.url, "run")
        after = buf.stats()
        for key in (
            "buffer/released",
            "buffer/produced",
            "buffer/consumed",
            "buffer/depth",
            "buffer/version",
            "buffer/inflight_groups",
            "buffer/leased_prompts",
            "buffer/pending_prompts",
            "buffer/staleness_tokens",
        ):
            assert after[key] == before[key], key
        assert (after["buffer/depth"], after["buffer/leased_prompts"], after["buffer/pending_prompts"]) == (
            1,
            1,
            2,
        )
        pending = buf.pending_groups("learner-0")
        assert [t.group.group_id for t in pending] == [taken[1].group.group_id]
        assert [t.group.group_id for t in buf.take(5, block_ms=0)] == [leased[2].prompt.group_id]
        # the still-leased prompt is a pending entry of gen-0; the unclaimed ones are claimable
        (lease,) = redis.Redis.from_url(buf.url).xpending_range(
            buf.key("prompts"), "generators", "-", "+", 10
        )
        assert lease["consumer"] == b"gen-0" and lease["message_id"].decode() == leased[3].entry_id
        assert [c.prompt.index for c in buf.claim_prompts("gen-1", 5)] == [4, 5]
        assert buf.version() == 3
    finally:
        server.stop()


def test_a_runs_local_server_keeps_its_aof_and_publishes_its_url_while_it_runs(tmp_path):
    url_file = local_redis_dir(tmp_path) / "url"
    with LocalRedis(local_redis_dir(tmp_path)) as server:
        url = server.url
        assert url_file.read_text().strip() == url  # where `sr1 buffer watch --run-dir` finds it
        ReplayBuffer(url, "r").release_prompts([make_prompt(0)])
    assert not url_file.exists()
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    with pytest.raises(redis.ConnectionError):
        client.ping()  # the local server was stopped
    with LocalRedis(
        local_redis_dir(tmp_path)
    ) as server:  # reopened run directory: the AOF brings the prompt back
        assert ReplayBuffer(server.url, "r").stats()["buffer/pending_prompts"] == 1
