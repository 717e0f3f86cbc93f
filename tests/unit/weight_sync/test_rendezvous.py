"""Redis coordination: rendezvous, rank claims per epoch, announced updates, acks and their timeouts."""

from __future__ import annotations

import json
import time

import pytest

from weight_sync.rendezvous import Rendezvous

NS = "wsunit"
INFO = {"addr": "127.0.0.1", "port": 1234, "world_size": 3, "backend": "gloo", "epoch": 1, "timeout_s": 5.0}


@pytest.fixture
def rv(redis_url):
    with Rendezvous(redis_url, NS) as rendezvous:
        yield rendezvous


@pytest.fixture
def other_ns(redis_url):
    """Rendezvous of other namespaces, closed after the test."""
    opened: list[Rendezvous] = []

    def open_ns(namespace: str) -> Rendezvous:
        opened.append(Rendezvous(redis_url, namespace))
        return opened[-1]

    yield open_ns
    for rendezvous in opened:
        rendezvous.close()


def test_rendezvous_round_trip_and_rank_claims_per_epoch(rv):
    assert rv.read() is None
    rv.publish(INFO)
    assert rv.read() == INFO
    assert [rv.claim_rank(1, "g0"), rv.claim_rank(1, "g1")] == [1, 2]
    assert rv.members(1) == {1: "g0", 2: "g1"}
    with pytest.raises(RuntimeError, match="world size 3.*claimed rank 3"):
        rv.claim_rank(1, "g2")
    # a new epoch starts counting again
    rv.publish({**INFO, "epoch": 2})
    assert rv.claim_rank(2, "g1") == 1


def test_malformed_info_and_update_are_rejected(rv):
    with pytest.raises(ValueError, match="lacks.*port"):
        rv.publish({k: v for k, v in INFO.items() if k != "port"})
    with pytest.raises(ValueError, match="lacks.*buckets"):
        rv.announce_update({"version": 1, "epoch": 1, "dtype": "float32"})


def test_announce_latest_and_acks(rv):
    assert rv.latest_update() is None
    update = {"version": 4, "epoch": 1, "buckets": [[["w", "float32", [2, 2]]]], "dtype": "float32"}
    rv.announce_update(update)
    assert rv.latest_update() == update
    rv.ack_update(4, "g0")
    rv.ack_update(4, "g1")
    rv.wait_acks(4, 2, timeout_s=1)


def test_wait_acks_names_the_missing_engine(rv):
    rv.ack_update(5, "g0")
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"1 of 2 engines acked.*missing: g1 \(rank 2\)"):
        rv.wait_acks(5, 2, timeout_s=0.3, expected={1: "g0", 2: "g1"})
    assert time.monotonic() - start < 2


def test_keys_keep_their_layout_on_the_wire(rv, redis_url):
    """Every key sits under `<namespace>:ws:` with the names engines and learners of other builds expect."""
    import redis

    assert rv.next_epoch() == 1
    rv.publish(INFO)
    rv.claim_rank(1, "g0")
    rv.announce_update({**UPDATE, "version": 4})
    rv.ack_update(4, "g0")
    r = redis.Redis.from_url(redis_url)
    try:
        keys = {k.decode() for k in r.keys(f"{NS}:*")}
        names = ["epoch", "rendezvous", "rank:1", "members:1", "update", "acks:4", "events", "ack_events"]
        assert keys == {f"{NS}:ws:{name}" for name in names}
        assert r.get(f"{NS}:ws:rendezvous") == json.dumps(INFO).encode()
        assert r.hgetall(f"{NS}:ws:members:1") == {b"1": b"g0"}
        assert r.smembers(f"{NS}:ws:acks:4") == {b"g0"}
        assert [fields for _, fields in r.xrange(f"{NS}:ws:events")] == [
            {b"kind": b"rendezvous", b"value": b"1"},
            {b"kind": b"update", b"value": b"4"},
        ]
        assert [fields for _, fields in r.xrange(f"{NS}:ws:ack_events")] == [
            {b"kind": b"ack", b"value": b"4"}
        ]
        rv.clear()
        assert not r.exists(f"{NS}:ws:rendezvous")
    finally:
        r.close()


class _FakeEngine:
    """Stands in for AsyncLLM: records the calls the engine side makes (pause, rpc, resume)."""

    def __init__(self):
        self.calls: list[str] = []

    async def pause_generation(self, **_):
        self.calls.append("pause")

    async def resume_generation(self):
        self.calls.append("resume")

    async def collective_rpc(self, method, args=()):
        self.calls.append(method)
        return [7]


async def test_engine_takes_the_starting_weights_even_at_its_own_version(rv):
    """A fresh learner publishes version 0 to engines that already say version 0: they must still receive it
    (the broadcast needs every member), and they must not load the same (epoch, version) twice."""
    from tests.fakes.weight_sync import receive_and_ack
    from weight_sync.engine_side import EngineWeightSync

    sync, engine = EngineWeightSync(rv, "g0"), _FakeEngine()
    rv.publish(INFO)
    assert await sync.ensure_joined(engine)
    update = {"version": 0, "epoch": 1, "buckets": [[["w", "float32", [2]]]], "dtype": "float32"}
    rv.announce_update(update)
    assert sync.pending_update(current_version=0) == update
    assert await receive_and_ack(engine, sync, update) == 7
    assert engine.calls == ["ws_join", "pause", "ws_receive", "resume"]
    assert rv.acked(0) == {"g0"}
    assert sync.pending_update(current_version=0) is None  # applied already
    rv.announce_update({**update, "version": 1})
    assert sync.pending_update(current_version=0)["version"] == 1
    assert sync.pending_update(current_version=2) is None  # older than what the engine holds


UPDATE = {"version": 1, "epoch": 1, "buckets": [[["w", "float32", [2]]]], "dtype": "float32"}


def test_engines_wait_on_announcements_instead_of_polling(other_ns):
    import threading

    rv = other_ns("wsevents")
    cursor = rv.event_cursor()
    assert cursor == "0-0"  # nothing announced yet
    assert rv.wait_for_event(cursor, timeout_s=0.05) == cursor  # nothing came: same cursor back
    # an announcement made between taking the cursor and waiting is not missed: the wait returns at once
    rv.publish(INFO)
    after_rendezvous = rv.wait_for_event(cursor, timeout_s=30)
    assert after_rendezvous != cursor and rv.event_cursor() == after_rendezvous
    # a wait in progress wakes when the learner announces an update (long before its 30 s timeout)
    timer = threading.Timer(0.2, rv.announce_update, args=({**UPDATE, "version": 2},))
    start = time.monotonic()
    timer.start()
    after_update = rv.wait_for_event(after_rendezvous, timeout_s=30)
    timer.join()
    assert time.monotonic() - start < 15 and after_update != after_rendezvous
    assert rv.latest_update()["version"] == 2


def test_wait_acks_wakes_on_the_last_ack_instead_of_polling(other_ns):
    import threading

    rv = other_ns("wsackwake")
    rv.ack_update(3, "g0")  # an ack of an older version does not count
    rv.ack_update(4, "g0")
    timer = threading.Timer(0.2, rv.ack_update, args=(4, "g1"))
    start = time.monotonic()
    timer.start()
    rv.wait_acks(4, 2, timeout_s=30, expected={1: "g0", 2: "g1"})
    timer.join()
    assert time.monotonic() - start < 15  # woken by g1's ack, long before the 30 s timeout
    assert rv.acked(4) == {"g0", "g1"}
