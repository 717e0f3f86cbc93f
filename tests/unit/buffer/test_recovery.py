"""What the buffer does for crash recovery: gauges that tell the stages of a group apart, a restarted worker's leases
and evaluation requests given back, groups of lost steps generated again, and a Redis restart ridden out."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from buffer.admission import BatchAssembler, PromptFeeder
from buffer.redis_buffer import ReplayBuffer
from fakes.groups import make_group, make_prompt
from sr1.launch.redis_server import LocalRedis
from tests.timing import scaled


def _buf(url: str, **kw) -> ReplayBuffer:
    return ReplayBuffer(url, "rec", lease_s=30, **kw)


def test_the_three_stages_of_a_released_group_add_up(redis_url):
    buf = _buf(redis_url)
    buf.release_prompts([make_prompt(i) for i in range(5)])
    for c in buf.claim_prompts("g", 3):
        buf.put_group(make_group(c.prompt, n=2, response_len=10), c.entry_id)
    taken = buf.take(2, block_ms=0)
    buf.mark_trained([taken[0].entry_id])
    stats = buf.stats()
    assert (
        stats["buffer/generating_groups"],
        stats["buffer/queued_groups"],
        stats["buffer/trained_unacked"],
    ) == (
        2,
        2,
        1,
    )
    assert stats["buffer/inflight_groups"] == 5
    buf.ack([taken[0].entry_id])
    assert buf.stats()["buffer/trained_unacked"] == 0


def test_a_restarted_worker_gets_back_its_leases_and_evaluation_requests(redis_url):
    buf = _buf(redis_url)
    buf.release_prompts([make_prompt(i) for i in range(3)])
    held = [c.entry_id for c in buf.claim_prompts("gen-0", 2)]
    eval_id = buf.request_evaluation(step=4, version=4, max_prompts=10)
    assert buf.pop_evaluation_request("gen-0")["version"] == 4
    assert buf.pop_evaluation_request("gen-1") is None
    # gen-0 died; its restart gives back what its earlier life held, and anyone takes it at once
    assert sorted(buf.leased_by("gen-0")) == sorted(held)
    buf.release_claims("gen-0", buf.leased_by("gen-0"))
    assert buf.requeue_evaluations("gen-0") == 1
    assert len(buf.claim_prompts("gen-1", 5)) == 3
    request = buf.pop_evaluation_request("gen-1")
    buf.post_evaluation_answer(request, {"eval/em": 0.5})
    assert buf.evaluation_answers(eval_id) == [{"eval/em": 0.5}] and buf.requeue_evaluations("gen-1") == 0


def test_an_evaluation_is_shared_by_its_shards_and_complete_only_when_all_answered(redis_url):
    buf = _buf(redis_url)
    eval_id = buf.request_evaluation(step=2, version=2, shards=3, max_prompts=30, greedy=True)
    requests = [buf.pop_evaluation_request(f"gen-{i}") for i in range(3)]
    assert [r["shard"] for r in requests] == [[0, 3], [1, 3], [2, 3]]
    assert {r["eval_id"] for r in requests} == {eval_id} and all(r["max_prompts"] == 30 for r in requests)
    for r in requests[:2]:
        buf.post_evaluation_answer(r, {"shard": r["shard"][0]})
    assert buf.evaluation_answers(eval_id) is None  # one shard still out
    with pytest.raises(TimeoutError, match="every shard"):
        buf.wait_evaluation(eval_id, timeout_s=0.3)
    buf.post_evaluation_answer(requests[2], {"shard": 2})
    assert buf.wait_evaluation(eval_id, timeout_s=scaled(1)) == [{"shard": 0}, {"shard": 1}, {"shard": 2}]
    buf.forget_evaluation(eval_id)  # recorded by whoever asked: its keys leave Redis (they stayed a week)
    assert not buf._redis.keys(f"rec:eval:*{eval_id}*")
    with pytest.raises(KeyError, match="no evaluation"):
        buf.evaluation_answers(eval_id)
    with pytest.raises(KeyError, match="no evaluation"):
        buf.evaluation_answers("eval-9-missing")
    with pytest.raises(ValueError, match="at least one shard"):
        buf.request_evaluation(step=2, version=2, shards=0)


def test_groups_trained_in_lost_steps_are_released_again_under_their_own_ids(redis_url):
    buf = _buf(redis_url)
    prompts = [make_prompt(i) for i in range(4)]
    feeder = PromptFeeder(buf, prompts, groups_per_step=2, max_staleness=1)
    feeder.pump()  # releases all 4 at version 0
    for c in buf.claim_prompts("g", 4):
        buf.put_group(make_group(c.prompt, n=2, response_len=10), c.entry_id)
    taken = buf.take(4, block_ms=0)
    buf.mark_trained([t.entry_id for t in taken[:2]])  # a step trained two of them, then the learner died
    buf.publish_version(3)
    lost = {t.group.group_id for t in taken[:2]}
    assert set(buf.recall_trained(feeder.prompt_of, version=3)) == lost
    stats = buf.stats()
    assert stats["buffer/released"] == 4 and stats["buffer/trained_unacked"] == 0
    assert stats["buffer/generating_groups"] == 2  # released anew ...
    again = buf.claim_prompts("g2", 4)
    assert {c.prompt.group_id for c in again} == lost and {c.prompt.release_version for c in again} == {3}
    # ... and their old entries are gone: a restarted learner gets back only the groups nobody trained
    assert {t.group.group_id for t in buf.pending_groups("learner-0")} == {
        t.group.group_id for t in taken[2:]
    }
    for c in again:
        assert buf.put_group(make_group(c.prompt, n=2, response_len=10), c.entry_id)  # not a duplicate


def test_prompt_of_finds_any_epoch_and_duplicate(redis_url):
    buf = _buf(redis_url)
    prompts = [make_prompt(i) for i in range(3)]
    prompts[2].group_id += "/dup1"
    feeder = PromptFeeder(buf, prompts, groups_per_step=1, max_staleness=0)
    assert feeder.prompt_of(prompts[1].in_epoch(4).group_id).group_id == prompts[1].in_epoch(4).group_id
    assert feeder.prompt_of(prompts[2].in_epoch(2).group_id).group_id.endswith("/e2/dup1")


def test_a_redis_restart_is_ridden_out_and_the_assembler_takes_back_what_it_missed(tmp_path):
    server = LocalRedis(tmp_path / "redis", appendfsync="always").start()
    buf = _buf(server.url, reconnect_s=30)
    buf.release_prompts([make_prompt(i) for i in range(2)])
    for c in buf.claim_prompts("g", 2):
        buf.put_group(make_group(c.prompt, n=2, response_len=10), c.entry_id)
    assembler = BatchAssembler(buf, groups_per_step=2, max_staleness=0)
    # a read whose reply is lost: delivered to the learner, never seen by it
    raw = redis.Redis.from_url(server.url)
    raw.xreadgroup("learner", "learner-0", {"rec:groups": ">"}, count=2)
    raw.close()
    server.kill()
    before = buf.reconnects.count
    started = time.monotonic()
    batches = []  # the assembler waits in a thread; Redis restarts from the main thread (children die with theirs)
    learner = threading.Thread(target=lambda: batches.append(assembler.next_batch(0, timeout_s=scaled(20))))
    learner.start()
    time.sleep(1.5)
    server.start()
    learner.join()
    assert buf.reconnects.count > before and time.monotonic() - started >= 1.0
    assert len(batches[0]) == 2  # it rode out the restart, then found its pending entries
    server.stop()


def test_groups_acked_by_a_checkpoint_given_up_on_resume_are_released_again(redis_url):
    """step_2 and step_4 were written and acked their groups; step_4 is found torn at resume, which loads step_2:
    the groups acked by step_4 are in no surviving weights and are generated again, with those trained after it."""
    buf = ReplayBuffer(redis_url, "durable", lease_s=30)
    prompts = [make_prompt(i) for i in range(6)]
    feeder = PromptFeeder(buf, prompts, groups_per_step=2, max_staleness=2)
    feeder.pump()  # all 6 at version 0
    for c in buf.claim_prompts("g", 6):
        buf.put_group(make_group(c.prompt, n=2, response_len=10), c.entry_id)
    taken = buf.take(6, block_ms=0)
    ids = [t.group.group_id for t in taken]
    buf.ack_durable([t.entry_id for t in taken[:2]], ids[:2], version=2)
    buf.ack_durable([t.entry_id for t in taken[2:4]], ids[2:4], version=4)
    buf.mark_trained([t.entry_id for t in taken[4:]])  # trained after step_4, never checkpointed
    assert buf.stats()["buffer/consumed"] == 4 and buf.durable_after(2) == ids[2:4]

    buf.publish_version(6)
    recalled = buf.recall_trained(feeder.prompt_of, version=6)
    recalled += buf.recall_durable(feeder.prompt_of, after=2, version=6)
    assert sorted(recalled) == sorted(ids[2:])
    stats = buf.stats()
    assert stats["buffer/released"] == 6 and stats["buffer/consumed"] == 2
    assert stats["buffer/inflight_groups"] == 4 and buf.durable_after(0) == ids[:2]
    again = buf.claim_prompts("g2", 6)
    assert sorted(c.prompt.group_id for c in again) == sorted(ids[2:])
    assert {c.prompt.release_version for c in again} == {6}
    for c in again:  # generated anew under their own ids: not duplicates
        assert buf.put_group(make_group(c.prompt, n=2, response_len=10), c.entry_id)
    assert buf.recall_durable(feeder.prompt_of, after=2, version=6) == []  # once only
    buf.forget_durable(up_to=2)  # step_2 became the oldest checkpoint kept: nothing before it can be given up
    assert buf.durable_after(-1) == []
    buf.close()
