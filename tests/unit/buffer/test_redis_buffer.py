"""ReplayBuffer against a real redis-server: prompts, leases, groups, acks, duplicates, dead letters, heartbeats."""

from __future__ import annotations

import time

import msgpack
import numpy as np
import pytest
import redis

from buffer.codec import encode_group
from buffer.redis_buffer import ReplayBuffer
from fakes.groups import make_group, make_prompt


@pytest.fixture
def buf(redis_url):
    b = ReplayBuffer(redis_url, "t", lease_s=0.2, learner_lease_s=0.2, heartbeat_ttl_s=0.3)
    yield b
    b.close()


def small_group(prompt, version=None):
    return make_group(prompt, n=2, prompt_len=5, response_len=12, version=version)


def test_prompt_round_trip_and_put_group_finishes_the_prompt(buf):
    prompts = [make_prompt(i, release_version=2) for i in range(3)]
    ids = buf.release_prompts(prompts)
    assert len(ids) == 3
    assert buf.inflight() == {p.group_id: 2 for p in prompts}
    claimed = buf.claim_prompts("gen-0", 2)
    assert [c.prompt for c in claimed] == prompts[:2]
    stats = buf.stats()
    assert (stats["buffer/pending_prompts"], stats["buffer/leased_prompts"]) == (1, 2)
    assert buf.put_group(small_group(claimed[0].prompt), claimed[0].entry_id)
    stats = buf.stats()
    assert (stats["buffer/leased_prompts"], stats["buffer/depth"], stats["buffer/produced"]) == (1, 1, 1)
    taken = buf.take(5, block_ms=0)
    assert [t.group.group_id for t in taken] == [prompts[0].group_id]
    assert taken[0].group.release_version == 2
    np.testing.assert_array_equal(
        taken[0].group.trajectories[1].response_ids, small_group(prompts[0]).trajectories[1].response_ids
    )
    assert buf.stats()["buffer/taken_unacked"] == 1
    buf.ack([taken[0].entry_id])
    stats = buf.stats()
    assert stats["buffer/consumed"] == 1 and stats["buffer/inflight_groups"] == 2
    assert stats["buffer/taken_unacked"] == 0 and stats["buffer/depth"] == 0


def test_re_released_group_id_is_skipped(buf):
    assert len(buf.release_prompts([make_prompt(0), make_prompt(1)])) == 2
    assert len(buf.release_prompts([make_prompt(1), make_prompt(2)])) == 1
    stats = buf.stats()
    assert stats["buffer/released"] == 3 and stats["buffer/duplicate_releases"] == 1


def test_duplicate_put_is_counted_and_not_delivered(buf):
    prompt = make_prompt(0)
    (entry,) = buf.release_prompts([prompt])
    assert buf.put_group(small_group(prompt), entry)
    assert not buf.put_group(small_group(prompt), entry)
    other = small_group(make_prompt(1))
    assert buf.put_groups([(other, ""), (other, "")]) == [True, False]  # a duplicate within one transaction
    assert [t.group.group_id for t in buf.take(5, block_ms=0)] == [prompt.group_id, other.group_id]
    assert buf.stats()["buffer/duplicates"] == 2


def test_expired_lease_is_reclaimed_by_another_generator(buf):
    buf.release_prompts([make_prompt(0), make_prompt(1)])
    first = buf.claim_prompts("dead-gen", 2)
    assert len(first) == 2
    assert buf.claim_prompts("gen-1", 2) == []  # leases still valid
    buf.renew_leases("dead-gen", [first[1].entry_id])
    time.sleep(0.25)
    buf.renew_leases("dead-gen", [first[1].entry_id])  # the live one keeps its second prompt
    again = buf.claim_prompts("gen-1", 2)
    assert [c.entry_id for c in again] == [first[0].entry_id]
    # the slow original finishing after all is a duplicate, not a second group
    assert buf.put_group(small_group(again[0].prompt), again[0].entry_id)
    assert not buf.put_group(small_group(first[0].prompt), first[0].entry_id)


def test_released_claims_are_taken_at_once(buf):
    buf.release_prompts([make_prompt(0)])
    (claimed,) = buf.claim_prompts("gen-0", 1)
    buf.release_claims("gen-0", [claimed.entry_id])
    (again,) = buf.claim_prompts("gen-1", 1)
    assert again.entry_id == claimed.entry_id


def test_dead_learner_entries_are_redelivered_but_not_own_held_ones(buf):
    prompts = [make_prompt(i) for i in range(3)]
    buf.put_groups([(small_group(p), "") for p in prompts])
    assert len(buf.take(2, consumer="learner-dead", block_ms=0)) == 2
    held = buf.take(1, consumer="learner-1", block_ms=0)
    time.sleep(0.25)
    buf.renew_taken("learner-1", [held[0].entry_id])
    again = buf.take(5, consumer="learner-1", block_ms=0)
    assert sorted(t.group.group_id for t in again) == sorted(p.group_id for p in prompts[:2])
    time.sleep(0.25)
    assert buf.take(5, consumer="learner-1", block_ms=0) == []  # its own idle entries are not re-taken


def test_pending_groups_after_learner_restart(buf, redis_url):
    prompts = [make_prompt(i) for i in range(4)]
    buf.put_groups([(small_group(p), "") for p in prompts])
    taken = buf.take(3, block_ms=0)
    buf.ack([taken[0].entry_id])
    restarted = ReplayBuffer(redis_url, "t")
    pending = restarted.pending_groups("learner-0")
    assert [t.entry_id for t in pending] == [t.entry_id for t in taken[1:]]
    restarted.ack([t.entry_id for t in pending])  # group ids read from the entries themselves
    assert restarted.pending_groups("learner-0") == []
    assert restarted.stats()["buffer/consumed"] == 3


def test_malformed_payloads_are_counted_dead_lettered_and_skipped(buf):
    good = [make_prompt(i) for i in range(2)]
    buf.put_group(small_group(good[0]), "")
    stream = buf.key("groups")
    redis.Redis.from_url(buf.url).xadd(stream, {"d": b"\xc1\xff garbage"})
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(payload := encode_group(small_group(make_prompt(9))))
    header = unpacker.unpack()
    header["schema"] = 99  # a payload from a newer build
    redis.Redis.from_url(buf.url).xadd(
        stream, {"gid": "x", "d": msgpack.packb(header, use_bin_type=True) + payload[unpacker.tell() :]}
    )
    redis.Redis.from_url(buf.url).xadd(stream, {"other": "no payload"})
    buf.put_group(small_group(good[1]), "")
    taken = buf.take(10, block_ms=0)
    assert [t.group.group_id for t in taken] == [p.group_id for p in good]
    stats = buf.stats()
    assert stats["buffer/malformed"] == 3 and stats["buffer/dead_letters"] == 3
    assert stats["buffer/depth"] == 0 and stats["buffer/taken_unacked"] == 2
    reasons = [
        fields[b"reason"].decode() for _, fields in redis.Redis.from_url(buf.url).xrange(buf.key("dead"))
    ]
    assert "not valid msgpack" in reasons[0] and "schema version 99" in reasons[1] and "no 'd'" in reasons[2]


def test_malformed_prompt_is_dead_lettered(buf):
    redis.Redis.from_url(buf.url).xadd(buf.key("prompts"), {"gid": "p", "d": b"nonsense"})
    buf.release_prompts([make_prompt(1)])
    assert [c.prompt.index for c in buf.claim_prompts("gen", 5)] == [1]
    assert buf.stats()["buffer/malformed"] == 1


def test_oversized_group_is_rejected_and_leaves_inflight(redis_url):
    buf = ReplayBuffer(redis_url, "t", max_payload_bytes=1000)
    prompt = make_prompt(0)
    (entry,) = buf.release_prompts([prompt])
    buf.claim_prompts("gen", 1)
    assert not buf.put_group(make_group(prompt, n=2, response_len=500), entry)
    stats = buf.stats()
    assert stats["buffer/oversized"] == 1 and stats["buffer/inflight_groups"] == 0
    assert stats["buffer/leased_prompts"] == 0 and buf.take(1, block_ms=0) == []


def test_version_and_heartbeats(buf):
    assert buf.version() == 0
    buf.publish_version(7)
    assert buf.version() == 7 and buf.stats()["buffer/version"] == 7
    buf.heartbeat("gen-0", "generator", {"rollout/tokens_per_s": 12.5})
    buf.heartbeat("learner-0", "learner", {})
    workers = {w["worker_id"]: w for w in buf.workers()}
    assert workers["gen-0"]["metrics"] == {"rollout/tokens_per_s": 12.5} and workers["gen-0"]["age_s"] < 1
    time.sleep(0.2)
    buf.heartbeat("learner-0", "learner", {})
    time.sleep(0.15)
    assert [w["worker_id"] for w in buf.workers()] == ["learner-0"]


def test_staleness_histogram_and_rates(buf):
    buf.record_consumed([0, 0, 1, 2, 2, 2])
    buf.record_consumed(np.array([1]))
    prompts = [make_prompt(i) for i in range(3)]
    buf.put_groups([(small_group(p), "") for p in prompts])
    buf.ack([t.entry_id for t in buf.take(3, block_ms=0)])
    stats = buf.stats()
    assert buf.staleness_histogram() == {0: 2, 1: 2, 2: 3}
    assert stats["buffer/staleness_max"] == 2 and stats["buffer/staleness_tokens"] == 7
    assert stats["buffer/staleness_mean"] == pytest.approx(8 / 7)
    assert stats["buffer/produced_per_s"] > 0 and stats["buffer/consumed_per_s"] > 0
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        buf.record_consumed([-1])


def test_recording_many_steps_keeps_one_key_of_recent_call_ids(buf, redis_url, monkeypatch):
    """A long run records a step every few seconds: the call ids guarding against a resent record live in one sorted
    set and leave it after their ttl, so neither the key count nor the set grows with the steps."""
    from buffer import stats

    raw = redis.Redis.from_url(redis_url)
    for _ in range(50):
        buf.record_consumed([0, 1])
    assert sorted(k.decode() for k in raw.keys("t:staleness*")) == ["t:staleness", "t:staleness:recorded"]
    assert raw.zcard("t:staleness:recorded") == 50 and buf.staleness_histogram() == {0: 50, 1: 50}
    monkeypatch.setattr(stats, "_RECORDED_TTL_S", 1)
    time.sleep(1.2)
    buf.record_consumed([2])
    assert raw.zcard("t:staleness:recorded") == 1 and buf.staleness_histogram() == {0: 50, 1: 50, 2: 1}


def test_namespaces_are_isolated(redis_url):
    a, b = ReplayBuffer(redis_url, "a"), ReplayBuffer(redis_url, "b")
    a.release_prompts([make_prompt(0)])
    assert b.claim_prompts("g", 1) == [] and len(a.claim_prompts("g", 1)) == 1
    assert a.key("x", "y") == "a:x:y"


def test_prompt_whose_leases_keep_expiring_is_dead_lettered(redis_url):
    buf = ReplayBuffer(redis_url, "t", lease_s=0.05, max_prompt_deliveries=2)
    prompt = make_prompt(0)
    buf.release_prompts([prompt])
    assert len(buf.claim_prompts("gen-a", 1)) == 1
    time.sleep(0.08)
    assert len(buf.claim_prompts("gen-b", 1)) == 1  # second delivery
    time.sleep(0.08)
    assert buf.claim_prompts("gen-c", 1) == []
    stats = buf.stats()
    assert stats["buffer/poison_prompts"] == 1 and stats["buffer/inflight_groups"] == 0


def test_a_prompt_that_fails_is_retried_then_dead_lettered_with_its_error(redis_url):
    buf = ReplayBuffer(redis_url, "t-fail", max_prompt_deliveries=2)
    buf.release_prompts([make_prompt(0), make_prompt(1)])
    first, other = buf.claim_prompts("gen-a", 2)
    buf.fail_prompt("gen-a", first.entry_id, "ValueError: bad chat template")
    (retry,) = buf.claim_prompts("gen-b", 1)  # retried at once, not after a lease
    assert retry.entry_id == first.entry_id
    buf.fail_prompt("gen-b", retry.entry_id, "ValueError: bad chat template again")
    assert buf.claim_prompts("gen-c", 1) == []
    (dead,) = buf.dead_letters()
    assert dead["gid"] == first.prompt.group_id and dead["stream"] == "t-fail:prompts"
    assert dead["reason"].endswith("bad chat template again") and "after 2 deliveries" in dead["reason"]
    stats = buf.stats()
    assert stats["buffer/failed_prompts"] == 1 and stats["buffer/abandoned_groups"] == 1
    assert stats["buffer/poison_prompts"] == 0 and set(buf.inflight()) == {other.prompt.group_id}
    # a prompt that fails once and then succeeds leaves no error behind
    buf.fail_prompt("gen-a", other.entry_id, "transient")
    (again,) = buf.claim_prompts("gen-a", 1)
    assert buf.put_group(make_group(again.prompt, n=1), again.entry_id)
    assert buf._redis.hlen(buf.key("prompt_errors")) == 0


def test_a_stray_malformed_payload_does_not_raise_the_admission_limit(redis_url):
    buf = ReplayBuffer(redis_url, "t-stray")
    buf._redis.xadd(buf.key("groups"), {"gid": "never/released/0/e0", "d": b"\x00garbage"})
    assert buf.take(10, block_ms=0) == []
    stats = buf.stats()
    assert (
        stats["buffer/malformed"] == 1 and stats["buffer/abandoned_groups"] == 0 and buf.replaced_count() == 0
    )
