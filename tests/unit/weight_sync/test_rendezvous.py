"""Redis coordination: rendezvous, rank claims per epoch, announced updates, acks and their timeouts."""

from __future__ import annotations

import time

import pytest
import redis

from weight_sync import rendezvous as rv

NS = "wsunit"
INFO = {"addr": "127.0.0.1", "port": 1234, "world_size": 3, "backend": "gloo", "epoch": 1, "timeout_s": 5.0}


@pytest.fixture
def r(redis_url):
    return redis.Redis.from_url(redis_url)


def test_rendezvous_round_trip_and_rank_claims_per_epoch(r):
    assert rv.read_rendezvous(r, NS) is None
    rv.publish_rendezvous(r, NS, INFO)
    assert rv.read_rendezvous(r, NS) == INFO
    assert [rv.claim_rank(r, NS, 1, "g0"), rv.claim_rank(r, NS, 1, "g1")] == [1, 2]
    assert rv.members(r, NS, 1) == {1: "g0", 2: "g1"}
    with pytest.raises(RuntimeError, match="world size 3.*claimed rank 3"):
        rv.claim_rank(r, NS, 1, "g2")
    # a new epoch starts counting again
    rv.publish_rendezvous(r, NS, {**INFO, "epoch": 2})
    assert rv.claim_rank(r, NS, 2, "g1") == 1


def test_malformed_info_and_update_are_rejected(r):
    with pytest.raises(ValueError, match="lacks.*port"):
        rv.publish_rendezvous(r, NS, {k: v for k, v in INFO.items() if k != "port"})
    with pytest.raises(ValueError, match="lacks.*buckets"):
        rv.announce_update(r, NS, {"version": 1, "epoch": 1, "dtype": "float32"})


def test_announce_latest_and_acks(r):
    assert rv.latest_update(r, NS) is None
    update = {"version": 4, "epoch": 1, "buckets": [[["w", "float32", [2, 2]]]], "dtype": "float32"}
    rv.announce_update(r, NS, update)
    assert rv.latest_update(r, NS) == update
    rv.ack_update(r, NS, 4, "g0")
    rv.ack_update(r, NS, 4, "g1")
    rv.wait_acks(r, NS, 4, 2, timeout_s=1)


def test_wait_acks_names_the_missing_engine(r):
    rv.ack_update(r, NS, 5, "g0")
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"1 of 2 engines acked.*missing: g1 \(rank 2\)"):
        rv.wait_acks(r, NS, 5, 2, timeout_s=0.3, expected={1: "g0", 2: "g1"})
    assert time.monotonic() - start < 2


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


async def test_engine_takes_the_starting_weights_even_at_its_own_version(r):
    """A fresh learner publishes version 0 to engines that already say version 0: they must still receive it
    (the broadcast needs every member), and they must not load the same (epoch, version) twice."""
    from weight_sync.engine_side import EngineWeightSync

    sync, engine = EngineWeightSync(r, NS, "g0"), _FakeEngine()
    rv.publish_rendezvous(r, NS, INFO)
    assert await sync.ensure_joined(engine)
    update = {"version": 0, "epoch": 1, "buckets": [[["w", "float32", [2]]]], "dtype": "float32"}
    rv.announce_update(r, NS, update)
    assert sync.pending_update(current_version=0) == update
    assert await sync.apply(engine, update) == 7
    assert engine.calls == ["ws_join", "pause", "ws_receive", "resume"]
    assert sync.pending_update(current_version=0) is None  # applied already
    rv.announce_update(r, NS, {**update, "version": 1})
    assert sync.pending_update(current_version=0)["version"] == 1
    assert sync.pending_update(current_version=2) is None  # older than what the engine holds


UPDATE = {"version": 1, "epoch": 1, "buckets": [[["w", "float32", [2]]]], "dtype": "float32"}


def test_engines_wait_on_announcements_instead_of_polling(r):
    import threading

    ns = "wsevents"
    cursor = rv.event_cursor(r, ns)
    assert cursor == "0-0"  # nothing announced yet
    assert rv.wait_for_event(r, ns, cursor, timeout_s=0.05) == cursor  # nothing came: same cursor back
    # an announcement made between taking the cursor and waiting is not missed: the wait returns at once
    rv.publish_rendezvous(r, ns, INFO)
    after_rendezvous = rv.wait_for_event(r, ns, cursor, timeout_s=30)
    assert after_rendezvous != cursor and rv.event_cursor(r, ns) == after_rendezvous
    # a wait in progress wakes when the learner announces an update (long before its 30 s timeout)
    timer = threading.Timer(0.2, rv.announce_update, args=(r, ns, {**UPDATE, "version": 2}))
    start = time.monotonic()
    timer.start()
    after_update = rv.wait_for_event(r, ns, after_rendezvous, timeout_s=30)
    timer.join()
    assert time.monotonic() - start < 15 and after_update != after_rendezvous
    assert rv.latest_update(r, ns)["version"] == 2


def test_wait_acks_wakes_on_the_last_ack_instead_of_polling(r):
    import threading

    ns = "wsackwake"
    rv.ack_update(r, ns, 3, "g0")  # an ack of an older version does not count
    rv.ack_update(r, ns, 4, "g0")
    timer = threading.Timer(0.2, rv.ack_update, args=(r, ns, 4, "g1"))
    start = time.monotonic()
    timer.start()
    rv.wait_acks(r, ns, 4, 2, timeout_s=30, expected={1: "g0", 2: "g1"})
    timer.join()
    assert time.monotonic() - start < 15  # woken by g1's ack, long before the 30 s timeout
    assert rv.acked(r, ns, 4) == {"g0", "g1"}
