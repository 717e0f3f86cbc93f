"""Every JSON value read back from Redis goes through one decoder that names what it was decoding."""

from __future__ import annotations

import pytest
import redis

from buffer.guarded_json import MalformedJSON, decode_json
from buffer.redis_buffer import ReplayBuffer
from weight_sync.rendezvous import Rendezvous


def test_the_decoder_names_what_it_decoded_and_what_was_expected():
    assert decode_json(b'{"a": 1}', "a thing") == {"a": 1}
    with pytest.raises(MalformedJSON, match=r"the heartbeat of worker g is not valid JSON.*'\{not json'"):
        decode_json(b"{not json", "the heartbeat of worker g")
    with pytest.raises(MalformedJSON, match="an evaluation request must be a JSON object, got a array"):
        decode_json("[1, 2]", "an evaluation request")
    assert decode_json("[1]", "a list", expect=list) == [1]


def test_a_garbage_heartbeat_is_skipped_not_a_crash(redis_url):
    buf = ReplayBuffer(redis_url, "hb")
    buf.heartbeat("gen-0", "generator", {})
    raw = redis.Redis.from_url(redis_url)
    raw.sadd("hb:workers", "intruder")
    raw.set("hb:worker:intruder", b"\x00garbage")
    assert [w["worker_id"] for w in buf.workers()] == ["gen-0"]


def test_a_garbage_evaluation_result_names_its_shard(redis_url):
    buf = ReplayBuffer(redis_url, "ev")
    eval_id = buf.request_evaluation(step=1, version=1, shards=1)
    request = buf.pop_evaluation_request("gen-0")
    buf.post_evaluation_answer(request, {"eval/em": 0.5})
    redis.Redis.from_url(redis_url).set(f"ev:eval:result:{eval_id}#0", "not json")
    with pytest.raises(
        MalformedJSON, match=f"the answer to evaluation shard .*{eval_id}#0 is not valid JSON"
    ):
        buf.evaluation_answers(eval_id)


def test_a_garbage_evaluation_request_is_counted_and_named(redis_url):
    buf = ReplayBuffer(redis_url, "ev")
    redis.Redis.from_url(redis_url).rpush("ev:eval:requests", "[]")
    with pytest.raises(ValueError, match="an evaluation request must be a JSON object"):
        buf.pop_evaluation_request("gen-0")
    assert int(redis.Redis.from_url(redis_url).get("ev:eval:malformed")) == 1


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("rendezvous", "oops", "the weight-sync rendezvous .* is not valid JSON"),
        ("rendezvous", '{"addr": "x"}', r"the weight-sync rendezvous .* lacks \['backend'"),
        ("update", "7", "the weight-sync update .* must be a JSON object"),
    ],
)
def test_a_garbage_rendezvous_or_update_is_named(redis_url, key, value, message):
    rv = Rendezvous(redis_url, "ws1")
    redis.Redis.from_url(redis_url).set(f"ws1:ws:{key}", value)
    read = rv.read if key == "rendezvous" else rv.latest_update
    with pytest.raises(MalformedJSON, match=message):
        read()
    rv.close()
