"""Every write of the buffer, run on a real Redis whose reply is then lost (a network cut between the command and its
answer): the client sends it again (buffer/connection.py), and the state must be what one run of it leaves. The
writes that were not safe to repeat before (a drop, a recall, a dead letter, the staleness histogram, an evaluation
request, an evaluation pop) are among them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
import redis.client

from buffer import lua
from buffer.admission import BatchAssembler
from buffer.redis_buffer import ReplayBuffer
from fakes.groups import make_group, make_prompt
from tests.timing import scaled


class LostReplies:
    """Makes the next command (or MULTI) that matches run on Redis, then raise ConnectionError as if its reply was
    lost on the way back."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self._pending: list[Callable[[tuple], bool]] = []
        self.lost = 0
        command, pipeline = redis.Redis.execute_command, redis.client.Pipeline.execute

        def execute_command(client, *args, **options):
            result = command(client, *args, **options)
            self._lose_if_matching([args])
            return result

        def execute(pipe, raise_on_error=True):
            sent = [args for args, _ in pipe.command_stack]
            result = pipeline(pipe, raise_on_error)
            self._lose_if_matching(sent)
            return result

        monkeypatch.setattr(redis.Redis, "execute_command", execute_command)
        monkeypatch.setattr(redis.client.Pipeline, "execute", execute)

    def next(self, matches: Callable[[tuple], bool]) -> None:
        self._pending.append(matches)

    def next_script(self, source: str) -> None:
        self.next(lambda args: args[0] == "EVAL" and args[1] == source)

    def next_command(self, name: str) -> None:
        self.next(lambda args: str(args[0]).upper() == name)

    def _lose_if_matching(self, commands: list[tuple]) -> None:
        for matches in self._pending:
            if any(matches(args) for args in commands):
                self._pending.remove(matches)
                self.lost += 1
                raise redis.ConnectionError("the reply was lost (test)")


@pytest.fixture
def lose(monkeypatch):
    return LostReplies(monkeypatch)


@pytest.fixture
def buf(redis_url):
    b = ReplayBuffer(redis_url, "lost", lease_s=30, reconnect_s=5)
    yield b
    b.close()


def _raw(buf: ReplayBuffer) -> redis.Redis:
    return redis.Redis.from_url(buf.url)


def _counters(buf: ReplayBuffer) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in _raw(buf).hgetall(buf.key("counters")).items()}


def _produce(buf: ReplayBuffer, n: int, first: int = 0) -> list:
    buf.release_prompts([make_prompt(i) for i in range(first, first + n)])
    for c in buf.claim_prompts("gen-0", n):
        buf.put_group(make_group(c.prompt, n=2, response_len=10), c.entry_id)
    return buf.take(n, block_ms=0)


def test_a_release_sent_twice_releases_once(buf, lose):
    lose.next_script(lua.RELEASE)
    buf.release_prompts([make_prompt(i) for i in range(3)])
    assert lose.lost == 1
    assert _raw(buf).xlen(buf.key("prompts")) == 3 and buf.released_count() == 3
    assert set(buf.inflight()) == {make_prompt(i).group_id for i in range(3)}


def test_a_put_sent_twice_is_delivered_once(buf, lose):
    buf.release_prompts([make_prompt(0)])
    (claim,) = buf.claim_prompts("gen-0", 1)
    lose.next_script(lua.PUT)
    assert not buf.put_group(
        make_group(claim.prompt, n=2, response_len=10), claim.entry_id
    )  # the retry's answer
    assert lose.lost == 1
    assert [t.group.group_id for t in buf.take(5, block_ms=0)] == [claim.prompt.group_id]
    counters = _counters(buf)
    assert counters["produced"] == 1 and counters["duplicates"] == 1
    assert buf.stats()["buffer/leased_prompts"] == 0  # the prompt was finished once


def test_an_ack_sent_twice_counts_once(buf, lose):
    taken = _produce(buf, 2)
    lose.next_script(lua.ACK)
    buf.ack([t.entry_id for t in taken])
    assert lose.lost == 1 and _counters(buf)["consumed"] == 2 and buf.inflight() == {}


def test_a_drop_sent_twice_counts_once(buf, lose):
    """A `dropped` counted twice would let the feeder release one more group than the staleness bound allows."""
    taken = _produce(buf, 3)
    lose.next_script(lua.ACK)
    buf.drop([taken[0].entry_id])
    assert lose.lost == 1
    assert buf.dropped_count() == 1 and buf.replaced_count() == 1 and _counters(buf)["consumed"] == 1


def test_a_recall_sent_twice_releases_each_prompt_once(buf, lose):
    taken = _produce(buf, 3)
    buf.mark_trained([t.entry_id for t in taken[:2]])
    buf.publish_version(4)
    prompts = {make_prompt(i).group_id: make_prompt(i) for i in range(3)}
    lose.next_script(lua.RECALL)
    recalled = buf.recall_trained(prompts.__getitem__, version=4)
    assert lose.lost == 1
    assert sorted(recalled) == sorted(t.group.group_id for t in taken[:2])
    again = buf.claim_prompts("gen-1", 10)
    assert sorted(c.prompt.group_id for c in again) == sorted(recalled)  # released once each, at version 4
    assert {c.prompt.release_version for c in again} == {4}
    counters = _counters(buf)
    assert counters["released"] == 3 and counters["produced"] == 1 and counters["recalled"] == 2
    for c in again:  # generated anew: not a duplicate
        assert buf.put_group(make_group(c.prompt, n=2, response_len=10), c.entry_id)


def test_a_durable_ack_sent_twice_counts_once(buf, lose):
    taken = _produce(buf, 2)
    buf.mark_trained([t.entry_id for t in taken])
    lose.next(lambda args: str(args[0]).upper() == "ZADD" and "durable" in str(args[1]))
    buf.ack_durable([t.entry_id for t in taken], [t.group.group_id for t in taken], version=2)
    assert lose.lost == 1
    assert _counters(buf)["consumed"] == 2 and buf.inflight() == {}
    assert buf.durable_after(0) == sorted(t.group.group_id for t in taken)
    assert buf.stats()["buffer/trained_unacked"] == 0


def test_a_durable_recall_sent_twice_releases_each_prompt_once(buf, lose):
    """A checkpoint found torn at resume: the groups it acked are generated again, once."""
    taken = _produce(buf, 3)
    ids = [t.group.group_id for t in taken]
    buf.ack_durable([taken[0].entry_id], ids[:1], version=2)
    buf.ack_durable([t.entry_id for t in taken[1:]], ids[1:], version=4)
    prompts = {make_prompt(i).group_id: make_prompt(i) for i in range(3)}
    lose.next_script(lua.RECALL_DURABLE)
    recalled = buf.recall_durable(prompts.__getitem__, after=2, version=6)
    assert lose.lost == 1 and sorted(recalled) == sorted(ids[1:])
    again = buf.claim_prompts("gen-1", 10)
    assert sorted(c.prompt.group_id for c in again) == sorted(ids[1:])  # released once each, at version 6
    assert {c.prompt.release_version for c in again} == {6}
    counters = _counters(buf)
    assert counters["released"] == 3 and counters["produced"] == 1 and counters["consumed"] == 1
    assert counters["recalled"] == 2 and buf.durable_after(0) == ids[:1]
    for c in again:  # generated anew: not a duplicate
        assert buf.put_group(make_group(c.prompt, n=2, response_len=10), c.entry_id)
    lose.next_command("ZREMRANGEBYSCORE")
    buf.forget_durable(up_to=2)
    assert lose.lost == 2 and buf.durable_after(-1) == []


def test_forgetting_ids_sent_twice_forgets_once_and_records_each_id(buf, lose, tmp_path):
    """The trim after a checkpoint, resent after a lost reply: the watermark stays, nothing more is forgotten, each
    forgotten released id is in the record once, and what was forgotten is still recognised."""
    prompts = [make_prompt(i) for i in range(3)]
    buf.release_prompts(prompts, positions=[0, 1, 2])
    for c in buf.claim_prompts("gen-0", 3):
        buf.put_group(make_group(c.prompt, n=2, response_len=10), c.entry_id)
    taken = buf.take(3, block_ms=0)
    buf.ack_durable([t.entry_id for t in taken[:2]], [t.group.group_id for t in taken[:2]], version=2)
    record = tmp_path / "released_groups.txt"
    lose.next_script(lua.FORGET_IDS)
    buf.forget_ids(position=2, version=2, record=record)
    assert lose.lost == 1 and buf.forgotten_below() == (2, 2)
    assert record.read_text().splitlines() == [p.group_id for p in prompts[:2]]
    raw = _raw(buf)
    assert raw.zrange(buf.key("released_ids"), 0, -1) == [prompts[2].group_id.encode()]
    assert raw.zrange(buf.key("put_ids"), 0, -1) == [taken[2].group.group_id.encode()]  # in flight: kept
    assert buf.release_prompts(prompts[:1], positions=[0]) == []
    assert not buf.put_group(make_group(prompts[0], n=2, response_len=10))
    assert _counters(buf)["duplicate_releases"] == 1 and _counters(buf)["duplicates"] == 1


def test_a_dead_letter_sent_twice_is_counted_and_replaced_once(buf, lose):
    buf.release_prompts([make_prompt(0)])
    buf._redis.xadd(buf.key("groups"), {"gid": make_prompt(0).group_id, "d": b"\x00 not a group"})
    lose.next_script(lua.DEAD_LETTER)
    assert buf.take(5, block_ms=0) == []
    assert lose.lost == 1
    counters = _counters(buf)
    assert counters["malformed"] == 1 and counters["abandoned"] == 1
    assert len(buf.dead_letters()) == 1


def test_an_oversized_put_sent_twice_is_counted_once(redis_url, lose):
    buf = ReplayBuffer(redis_url, "lost", max_payload_bytes=100, reconnect_s=5)
    buf.release_prompts([make_prompt(0)])
    (claim,) = buf.claim_prompts("gen-0", 1)
    lose.next_script(lua.DEAD_LETTER)
    assert not buf.put_group(make_group(claim.prompt, n=2, response_len=50), claim.entry_id)
    assert lose.lost == 1
    counters = _counters(buf)
    assert counters["oversized"] == 1 and counters["abandoned"] == 1 and len(buf.dead_letters()) == 1


def test_marking_trained_sent_twice_keeps_every_group_id(buf, lose):
    taken = _produce(buf, 2)
    lose.next_script(lua.MARK_TRAINED)
    buf.mark_trained([t.entry_id for t in taken])
    assert lose.lost == 1
    trained = {k.decode(): v.decode() for k, v in _raw(buf).hgetall(buf.key("trained")).items()}
    assert trained == {t.entry_id: t.group.group_id for t in taken}
    assert buf.stats()["buffer/trained_unacked"] == 2


def test_the_staleness_histogram_counts_a_step_once(buf, lose):
    lose.next_script(lua.RECORD_CONSUMED)
    buf.record_consumed([0, 0, 1])
    buf.record_consumed([2])
    assert lose.lost == 1 and buf.staleness_histogram() == {0: 2, 1: 1, 2: 1}


def test_a_version_publish_delivered_late_never_takes_the_version_back(buf, lose):
    lose.next_script(lua.PUBLISH_VERSION)
    buf.publish_version(5)
    assert lose.lost == 1 and buf.version() == 5
    buf.publish_version(6)
    buf.publish_version(5)  # the first copy of an earlier publish, arriving after the newer one
    assert buf.version() == 6
    buf.publish_version(0, reset=True)  # a fresh run on a used namespace
    assert buf.version() == 0


def test_an_evaluation_request_sent_twice_is_queued_once(buf, lose):
    lose.next_script(lua.REQUEST_EVALUATION)
    eval_id = buf.request_evaluation(step=2, version=2, shards=2)
    assert lose.lost == 1 and _raw(buf).llen(buf.key("eval", "requests")) == 2
    first, second = buf.pop_evaluation_request("gen-0"), buf.pop_evaluation_request("gen-1")
    assert [first["shard"], second["shard"]] == [[0, 2], [1, 2]]
    assert buf.pop_evaluation_request("gen-2") is None
    lose.next(lambda args: args[0] == "SET" and "result" in str(args[1]))
    buf.post_evaluation_answer(first, {"shard": 0})
    buf.post_evaluation_answer(second, {"shard": 1})
    assert lose.lost == 2 and buf.evaluation_answers(eval_id) == [{"shard": 0}, {"shard": 1}]


def test_a_popped_evaluation_request_whose_reply_was_lost_comes_back_to_its_worker(buf, lose):
    """Before, the request sat in the worker's taken list until the worker restarted, and the evaluation timed out."""
    eval_id = buf.request_evaluation(step=3, version=3, shards=1)
    lose.next_script(lua.POP_EVALUATION)
    with pytest.raises(redis.ConnectionError):  # the worker's own retry loop (the client's gave up at once)
        ReplayBuffer(buf.url, "lost", reconnect_s=0).pop_evaluation_request("gen-0")
    request = buf.pop_evaluation_request("gen-0")
    assert request is not None and request["eval_id"] == eval_id
    buf.post_evaluation_answer(request, {"eval/em": 1.0})
    assert buf.evaluation_answers(eval_id) == [{"eval/em": 1.0}]
    assert buf.pop_evaluation_request("gen-0") is None


def test_a_malformed_evaluation_request_is_counted_once(buf, lose):
    _raw(buf).rpush(buf.key("eval", "requests"), b"{not json")
    lose.next_script(lua.DROP_MALFORMED_EVALUATION)
    with pytest.raises(ValueError, match="malformed eval request"):
        buf.pop_evaluation_request("gen-0")
    assert lose.lost == 1 and int(_raw(buf).get(buf.key("eval", "malformed"))) == 1
    assert buf.pop_evaluation_request("gen-0") is None


def test_a_claim_whose_reply_was_lost_leaves_a_lease_the_worker_can_find_and_give_back(buf, lose):
    buf.release_prompts([make_prompt(i) for i in range(2)])
    lose.next_command("XREADGROUP")
    assert buf.claim_prompts("gen-0", 2) == []  # the retry reads nothing new: both went to the lost reply
    orphans = buf.leased_by("gen-0")
    assert len(orphans) == 2
    buf.release_claims("gen-0", orphans)  # what the generator worker does after a reconnect
    assert len(buf.claim_prompts("gen-1", 2)) == 2


def test_a_take_whose_reply_was_lost_is_recovered_by_the_assembler(buf, lose):
    _produce(buf, 0)
    buf.release_prompts([make_prompt(i) for i in range(2)])
    for c in buf.claim_prompts("gen-0", 2):
        buf.put_group(make_group(c.prompt, n=2, response_len=10), c.entry_id)
    assembler = BatchAssembler(buf, groups_per_step=2, max_staleness=0)
    lose.next_command("XREADGROUP")
    batch = assembler.next_batch(0, timeout_s=scaled(5))
    assert lose.lost == 1
    assert sorted(t.group.group_id for t in batch) == sorted(make_prompt(i).group_id for i in range(2))


def test_heartbeats_leases_and_bounds_sent_twice_change_nothing_more(buf, lose):
    buf.release_prompts([make_prompt(0)])
    (claim,) = buf.claim_prompts("gen-0", 1)
    lose.next(lambda args: args[0] == "SET" and "worker" in str(args[1]))
    buf.heartbeat("gen-0", "generator", {"rollout/version": 1})
    lose.next_command("XCLAIM")
    buf.renew_leases("gen-0", [claim.entry_id])
    lose.next_command("HSET")
    buf.set_staleness_bound(0, 2)
    lose.next_command("HSET")
    buf.fail_prompt("gen-0", claim.entry_id, "boom")
    assert lose.lost == 4
    assert [w["worker_id"] for w in buf.workers()] == ["gen-0"] and buf.staleness_bounds() == {0: 2}
    (again,) = buf.claim_prompts("gen-1", 1)  # given back once, claimable at once
    assert again.entry_id == claim.entry_id
