"""The de-duplication sets `released_ids` and `put_ids` against a real Redis: bounded over many checkpoints, and what
they forgot still recognised through the watermark (a replayed release, a late put); sets of an earlier sr1 upgraded;
a feeder whose release failed takes its prompts back (buffer/group_ids.py)."""

from __future__ import annotations

import time

import pytest
import redis

from buffer.admission import BatchAssembler, PromptFeeder
from buffer.group_ids import released_group_ids
from buffer.redis_buffer import ReplayBuffer
from fakes.groups import make_group, make_prompt


@pytest.fixture
def buf(redis_url):
    b = ReplayBuffer(redis_url, "ids", lease_s=30)
    yield b
    b.close()


def _sizes(buf: ReplayBuffer) -> tuple[int, int]:
    return buf._redis.zcard(buf.key("released_ids")), buf._redis.zcard(buf.key("put_ids"))


def _counters(buf: ReplayBuffer) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in buf._redis.hgetall(buf.key("counters")).items()}


def _finish_all(buf: ReplayBuffer) -> None:
    for c in buf.claim_prompts("gen-0", 1000):
        assert buf.put_group(make_group(c.prompt, n=1, prompt_len=3, response_len=4), c.entry_id)


def test_the_sets_stay_bounded_over_many_checkpoints_and_the_record_keeps_every_release(buf, tmp_path):
    """The learner's loop (release, generate, train, publish; every 3 steps a checkpoint acks and forgets) over 30
    steps: released_ids and put_ids never hold more than a checkpoint interval and the staleness window of ids,
    while the run releases ten times that; the record and the set together still name every id released."""
    steps, every, per_step, staleness = 30, 3, 4, 1
    bound = (every + staleness + 1) * per_step
    record = tmp_path / "released_groups.txt"
    prompts = [make_prompt(i) for i in range(500)]
    feeder = PromptFeeder(buf, prompts, groups_per_step=per_step, max_staleness=staleness)
    assembler = BatchAssembler(buf, groups_per_step=per_step, max_staleness=staleness)
    unacked, largest = [], (0, 0)
    for version in range(steps):
        feeder.pump()
        _finish_all(buf)
        largest = tuple(max(a, b) for a, b in zip(largest, _sizes(buf), strict=True))
        batch = assembler.next_batch(version, timeout_s=2)
        assert len(batch) == per_step
        buf.mark_trained([t.entry_id for t in batch])
        unacked += batch
        buf.publish_version(version + 1)
        if (version + 1) % every == 0:  # checkpoint step_<version + 1>, with the feeder's cursor
            buf.ack_durable([t.entry_id for t in unacked], [t.group.group_id for t in unacked], version + 1)
            unacked = []
            buf.forget_ids(feeder.cursor, version + 1, record=record)
    released = buf.released_count()
    assert released >= steps * per_step > 5 * bound
    assert max(largest) <= bound, f"the sets reached {largest} ids, more than {bound}"
    assert buf.forgotten_below() == (feeder.cursor, steps)
    assert released_group_ids(buf._redis, "ids", record) == {p.group_id for p in prompts[:released]}
    assert _counters(buf).get("duplicates", 0) == 0 and _counters(buf).get("duplicate_releases", 0) == 0


def test_a_replayed_release_below_the_watermark_is_skipped_and_counted(buf):
    """A feeder resumed from a checkpoint older than the watermark (a fallback past a torn one) replays prompts whose
    ids Redis forgot: each is skipped and counted as a duplicate release, as when the set held them."""
    prompts = [make_prompt(i) for i in range(20)]
    feeder = PromptFeeder(buf, prompts, groups_per_step=4, max_staleness=1)
    assert feeder.pump() == 8 and feeder.cursor == 8
    _finish_all(buf)
    taken = buf.take(8, block_ms=0)
    buf.ack_durable([t.entry_id for t in taken], [t.group.group_id for t in taken], version=2)
    buf.publish_version(2)
    assert buf.forget_ids(position=8, version=2) == 16  # 8 released ids and 8 put ids
    assert _sizes(buf) == (0, 0)

    resumed = PromptFeeder(buf, prompts, groups_per_step=4, max_staleness=1, cursor=2)
    assert resumed.pump() == 8 and resumed.cursor == 16  # positions 2..7 skipped, 8..15 released
    assert _counters(buf)["duplicate_releases"] == 6 and buf.released_count() == 16
    assert sorted(buf.inflight()) == sorted(p.group_id for p in prompts[8:16])
    # an id the set still holds is skipped as before, from whatever position
    assert buf.release_prompts([prompts[9]], positions=[30]) == []
    assert buf.release_prompts([prompts[9]]) == []
    assert _counters(buf)["duplicate_releases"] == 8 and buf.released_count() == 16


def test_a_late_duplicate_put_below_the_watermark_is_counted_and_never_delivered(redis_url):
    """A generator whose lease expired finishes after the group was trained, checkpointed and forgotten: its copy is
    a duplicate (counted, never delivered). A group released before the watermark but still in flight is put once."""
    buf = ReplayBuffer(redis_url, "late", lease_s=0.05)
    buf.release_prompts([make_prompt(0), make_prompt(1)], positions=[0, 1])
    slow = {c.prompt.group_id: c for c in buf.claim_prompts("gen-slow", 2)}
    time.sleep(0.1)  # its leases expire: another generator takes the prompts
    fast = {c.prompt.group_id: c for c in buf.claim_prompts("gen-fast", 2)}
    first, second = make_prompt(0).group_id, make_prompt(1).group_id
    assert buf.put_group(make_group(fast[first].prompt, n=2, response_len=5), fast[first].entry_id)
    (taken,) = buf.take(4, block_ms=0)
    buf.mark_trained([taken.entry_id])
    buf.ack_durable([taken.entry_id], [first], version=3)
    buf.publish_version(3)
    buf.forget_ids(position=2, version=3)
    assert _sizes(buf) == (0, 0)  # the other group is in flight, not put yet: nothing to remember

    late = make_group(slow[first].prompt, n=2, response_len=5)
    assert not buf.put_group(late, slow[first].entry_id)
    assert _counters(buf)["duplicates"] == 1 and buf._redis.xlen(buf.key("groups")) == 0
    assert buf.take(4, block_ms=0) == []

    # released at version 0 < 3, still in flight: its first put is delivered, its second is a duplicate
    assert buf.put_group(make_group(fast[second].prompt, n=2, response_len=5), fast[second].entry_id)
    buf.forget_ids(position=2, version=3)  # in flight: its id is kept
    assert not buf.put_group(make_group(slow[second].prompt, n=2, response_len=5), slow[second].entry_id)
    assert [t.group.group_id for t in buf.take(4, block_ms=0)] == [second]
    assert _counters(buf)["duplicates"] == 2 and _counters(buf)["produced"] == 2
    buf.close()


def test_a_recalled_group_is_generated_again_after_its_ids_were_forgotten(buf):
    """A checkpoint given up on resume (torn): the groups it acked are released anew although the sets forgot them,
    and their new puts are delivered."""
    prompts = [make_prompt(i) for i in range(4)]
    feeder = PromptFeeder(buf, prompts, groups_per_step=2, max_staleness=1)
    feeder.pump()
    _finish_all(buf)
    taken = buf.take(4, block_ms=0)
    ids = [t.group.group_id for t in taken]
    buf.ack_durable([t.entry_id for t in taken], ids, version=4)
    buf.publish_version(4)
    buf.forget_ids(feeder.cursor, 4)
    assert sorted(buf.recall_durable(feeder.prompt_of, after=2, version=5)) == sorted(ids)
    again = buf.claim_prompts("gen-1", 10)
    assert sorted(c.prompt.group_id for c in again) == sorted(ids)
    for c in again:
        assert buf.put_group(make_group(c.prompt, n=2, response_len=5), c.entry_id)
    assert len(buf.take(10, block_ms=0)) == 4


def test_sets_written_by_an_earlier_sr1_become_sorted_sets_and_still_deduplicate(redis_url):
    raw = redis.Redis.from_url(redis_url)
    raw.sadd("old:released_ids", make_prompt(0).group_id, make_prompt(1).group_id)
    raw.sadd("old:put_ids", make_prompt(0).group_id)
    raw.set("old:version", 7)
    buf = ReplayBuffer(redis_url, "old")
    assert raw.type("old:released_ids") == raw.type("old:put_ids") == b"zset"
    assert {s for _, s in raw.zrange("old:released_ids", 0, -1, withscores=True)} == {-1.0}
    assert raw.zscore("old:put_ids", make_prompt(0).group_id) == 7.0
    ReplayBuffer(redis_url, "old").close()  # opened again: nothing changes
    assert raw.zcard("old:released_ids") == 2 and raw.zcard("old:put_ids") == 1
    assert buf.release_prompts([make_prompt(1), make_prompt(2)], positions=[1, 2]) != []
    assert sorted(buf.inflight()) == [make_prompt(2).group_id]  # make_prompt(1) was released before
    assert not buf.put_group(make_group(make_prompt(0), n=1, response_len=3))
    buf.forget_ids(
        position=5, version=8
    )  # released without a position: kept; put before 8, not in flight: gone
    assert raw.zcard("old:released_ids") == 2 and raw.zcard("old:put_ids") == 0
    buf.close()
    raw.close()


@pytest.mark.parametrize("as_iterator", [False, True])
def test_a_feeder_whose_release_failed_takes_its_prompts_back(buf, monkeypatch, as_iterator):
    """Redis unreachable past reconnect_s during a release: the cursor does not move past the prompts, so the next
    pump releases them, and no checkpoint saves a cursor past a prompt that was not released."""
    prompts = [make_prompt(i) for i in range(10)]
    feeder = PromptFeeder(buf, iter(prompts) if as_iterator else prompts, groups_per_step=2, max_staleness=1)
    release = buf.release_prompts

    def unreachable(batch, positions=None):
        release(batch[:1], positions[:1])  # the call ran in part: its reply never came
        raise redis.ConnectionError("Redis unreachable (test)")

    monkeypatch.setattr(buf, "release_prompts", unreachable)
    with pytest.raises(redis.ConnectionError):
        feeder.pump()
    assert feeder.cursor == 0 and not feeder.exhausted
    monkeypatch.setattr(buf, "release_prompts", release)
    assert feeder.pump() == 3 and feeder.cursor == 4
    assert sorted(buf.inflight()) == sorted(p.group_id for p in prompts[:4])
