"""Redis coordination: rendezvous, rank claims per epoch (one per engine worker), announced updates, acks."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.timing import scaled
from weight_sync.rendezvous import Rendezvous, describe_members

NS = "wsunit"
INFO = {"addr": "127.0.0.1", "port": 1234, "backend": "gloo", "epoch": 1, "timeout_s": 5.0}


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
    # a new epoch starts counting again
    rv.publish({**INFO, "epoch": 2})
    assert rv.claim_rank(2, "g1") == 1
    assert rv.members(2) == {1: "g1"}


def test_an_engine_claims_one_rank_per_worker(rv):
    """A tensor-parallel engine of 2 workers takes two consecutive ranks; the learner waits for engines, not ranks,
    and its group has 1 + every claimed rank."""
    rv.publish(INFO)
    assert rv.claim_rank(1, "tp2", workers=2) == 1
    assert rv.claim_rank(1, "tp1") == 3
    assert rv.claim_rank(1, "tp4", workers=4) == 4
    members = {1: "tp2", 2: "tp2", 3: "tp1", 4: "tp4", 5: "tp4", 6: "tp4", 7: "tp4"}
    assert rv.members(1) == members
    assert rv.wait_members(1, 3, timeout_s=scaled(1)) == members
    with pytest.raises(TimeoutError, match=r"3 of 4 engines joined.*'tp1', 'tp2', 'tp4'"):
        rv.wait_members(1, 4, timeout_s=0.2)
    assert describe_members(members) == "tp2 (ranks 1-2), tp1 (rank 3), tp4 (ranks 4-7)"
    with pytest.raises(ValueError, match="workers=0"):
        rv.claim_rank(1, "none", workers=0)
    # engines without a name are told apart by their first rank
    assert [rv.claim_rank(1, workers=2), rv.claim_rank(1)] == [8, 10]
    assert rv.wait_members(1, 5, timeout_s=scaled(1)) == {**members, 8: "rank8", 9: "rank8", 10: "rank10"}


def test_concurrent_claims_leave_no_gap(rv):
    """Claims are atomic: whatever moment the learner reads the members, ranks 1..n are all there and each
    engine's ranks are consecutive (a gap would leave the group waiting for a rank nobody holds)."""
    rv.publish(INFO)
    sizes = {f"e{i}": 1 + i % 3 for i in range(24)}
    snapshots: list[dict[int, str]] = []

    def claim(worker_id: str) -> None:
        rv.claim_rank(1, worker_id, workers=sizes[worker_id])
        snapshots.append(rv.members(1))

    threads = [threading.Thread(target=claim, args=(w,)) for w in sizes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for members in [*snapshots, rv.members(1)]:
        assert sorted(members) == list(range(1, len(members) + 1))
        for worker_id in set(members.values()):
            held = [rank for rank, w in members.items() if w == worker_id]
            assert len(held) == sizes[worker_id] and held == list(range(held[0], held[0] + len(held)))
    assert len(rv.members(1)) == sum(sizes.values())


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
    rv.wait_acks(4, 2, timeout_s=scaled(1))


def test_wait_acks_names_the_missing_engine(rv):
    rv.ack_update(5, "g0")
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"1 of 2 engines acked.*missing: g1 \(rank 2\)"):
        rv.wait_acks(5, 2, timeout_s=0.3, expected={1: "g0", 2: "g1"})
    assert time.monotonic() - start < 0.3 + scaled(
        1.7
    )  # gave up at its timeout (plus the machine's overhead)


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
    """Stands in for AsyncLLM with `workers` workers: records the calls the engine side makes (pause, rpc, resume)."""

    def __init__(self, workers: int = 1):
        self.workers = workers
        self.calls: list[tuple[str, tuple]] = []

    async def pause_generation(self, **_):
        self.calls.append(("pause", ()))

    async def resume_generation(self):
        self.calls.append(("resume", ()))

    async def collective_rpc(self, method, args=()):
        self.calls.append((method, args))
        if method == "ws_worker_index":
            return list(range(self.workers))
        return [7] * self.workers


async def test_engine_takes_the_starting_weights_even_at_its_own_version(rv):
    """A fresh learner publishes version 0 to engines that already say version 0: they must still receive it
    (the broadcast needs every member), and they must not load the same (epoch, version) twice."""
    from fakes.weight_sync import receive_and_ack
    from weight_sync.engine_side import EngineWeightSync

    sync, engine = EngineWeightSync(rv, "g0"), _FakeEngine()
    rv.publish(INFO)
    assert await sync.ensure_joined(engine)
    update = {"version": 0, "epoch": 1, "buckets": [[["w", "float32", [2]]]], "dtype": "float32"}
    rv.announce_update(update)
    assert sync.pending_update(current_version=0) == update
    assert await receive_and_ack(engine, sync, update) == 7
    assert [call for call, _ in engine.calls] == [
        "ws_worker_index",
        "ws_join",
        "pause",
        "ws_receive",
        "resume",
    ]
    assert rv.acked(0) == {"g0"}
    assert sync.pending_update(current_version=0) is None  # applied already
    rv.announce_update({**update, "version": 1})
    assert sync.pending_update(current_version=0)["version"] == 1
    assert sync.pending_update(current_version=2) is None  # older than what the engine holds


async def test_a_tensor_parallel_engine_claims_a_rank_for_each_worker(rv):
    """The engine side asks the engine how many workers it has, claims that many ranks, and hands every worker the
    first one (each adds its own index)."""
    from weight_sync.engine_side import EngineWeightSync

    rv.publish(INFO)
    rv.claim_rank(1, "before")  # another engine claimed rank 1 first
    sync, engine = EngineWeightSync(rv, "tp2"), _FakeEngine(workers=2)
    assert await sync.ensure_joined(engine)
    assert engine.calls == [("ws_worker_index", ()), ("ws_join", (INFO, 2))]
    assert rv.members(1) == {1: "before", 2: "tp2", 3: "tp2"}
    assert await sync.ensure_joined(engine)  # joined already: no second claim
    assert len(engine.calls) == 2


async def test_workers_with_unexpected_indices_are_refused(rv):
    from weight_sync.engine_side import EngineWeightSync

    class _Shuffled(_FakeEngine):
        async def collective_rpc(self, method, args=()):
            return [0, 2] if method == "ws_worker_index" else await super().collective_rpc(method, args)

    rv.publish(INFO)
    with pytest.raises(RuntimeError, match=r"indices \[0, 2\], expected 0..1"):
        await EngineWeightSync(rv, "odd").ensure_joined(_Shuffled(workers=2))
    assert rv.members(1) == {}


UPDATE = {"version": 1, "epoch": 1, "buckets": [[["w", "float32", [2]]]], "dtype": "float32"}


def test_engines_wait_on_announcements_instead_of_polling(other_ns):
    rv = other_ns("wsevents")
    cursor = rv.event_cursor()
    assert cursor == "0-0"  # nothing announced yet
    assert rv.wait_for_event(cursor, timeout_s=0.05) == cursor  # nothing came: same cursor back
    # an announcement made between taking the cursor and waiting is not missed: the wait returns at once
    rv.publish(INFO)
    limit = scaled(30)  # the hang guard; a wake must come well before it (half of it below)
    after_rendezvous = rv.wait_for_event(cursor, timeout_s=limit)
    assert after_rendezvous != cursor and rv.event_cursor() == after_rendezvous
    # a wait in progress wakes when the learner announces an update (long before its 30 s timeout)
    timer = threading.Timer(0.2, rv.announce_update, args=({**UPDATE, "version": 2},))
    start = time.monotonic()
    timer.start()
    after_update = rv.wait_for_event(after_rendezvous, timeout_s=limit)
    timer.join()
    assert time.monotonic() - start < limit / 2 and after_update != after_rendezvous
    assert rv.latest_update()["version"] == 2


def test_wait_acks_wakes_on_the_last_ack_instead_of_polling(other_ns):
    rv = other_ns("wsackwake")
    rv.ack_update(3, "g0")  # an ack of an older version does not count
    rv.ack_update(4, "g0")
    timer = threading.Timer(0.2, rv.ack_update, args=(4, "g1"))
    start = time.monotonic()
    timer.start()
    limit = scaled(30)  # the hang guard
    rv.wait_acks(4, 2, timeout_s=limit, expected={1: "g0", 2: "g1"})
    timer.join()
    assert time.monotonic() - start < limit / 2  # woken by g1's ack, long before the timeout
    assert rv.acked(4) == {"g0", "g1"}


def test_a_completed_versions_ack_set_goes_when_the_next_version_completes(other_ns, redis_url):
    """One ack set per published version used to stay for an hour: hundreds of Redis keys in a soak of the tiny
    preset. The one before the last completed version is deleted; the last stays (it may still be looked at)."""
    import redis

    rv = other_ns("wsackgc")
    client = redis.Redis.from_url(redis_url)
    for version in range(1, 6):
        rv.ack_update(version, "g0")
        rv.wait_acks(version, 1, timeout_s=scaled(5))
        assert client.exists(f"wsackgc:ws:acks:{version}")
    assert sorted(client.keys("wsackgc:ws:acks:*")) == [b"wsackgc:ws:acks:5"]
    rv.ack_update(6, "g0")  # a publish whose wait timed out (one of two engines acked) ...
    with pytest.raises(TimeoutError):
        rv.wait_acks(6, 2, timeout_s=0.2)
    rv.ack_update(
        8, "g0"
    )  # ... and an ack of a version this learner never waited on (another learner's, late)
    rv.ack_update(7, "g0")
    rv.wait_acks(7, 1, timeout_s=scaled(5))  # 5 (completed before 7) and 6 (waited on, failed) are deleted
    assert sorted(client.keys("wsackgc:ws:acks:*")) == [b"wsackgc:ws:acks:7", b"wsackgc:ws:acks:8"]
    rv.ack_update(9, "g0")
    rv.wait_acks(9, 1, timeout_s=scaled(5))
    assert sorted(client.keys("wsackgc:ws:acks:*")) == [
        b"wsackgc:ws:acks:8",
        b"wsackgc:ws:acks:9",
    ]  # 8 to the TTL
    client.close()


def test_a_new_epoch_deletes_the_rank_counter_and_members_of_the_ones_before(other_ns, redis_url):
    """The learner re-forms its group whenever an engine leaves it (every evaluation pins an engine's weights): in a
    soak each epoch left its rank counter and member table for the TTL, two keys per evaluation."""
    import redis

    rv = other_ns("wsepochgc")
    client = redis.Redis.from_url(redis_url)
    for epoch in range(1, 8):
        rv.publish({**INFO, "epoch": epoch})
        rv.claim_rank(epoch, "g0")
        assert rv.members(epoch) == {1: "g0"}
    assert sorted(client.keys("wsepochgc:ws:rank:*") + client.keys("wsepochgc:ws:members:*")) == [
        b"wsepochgc:ws:members:7",
        b"wsepochgc:ws:rank:7",
    ]
    rv.claim_rank(9, "late")  # a claim in an epoch handed out but never published (a learner restarted)
    rv.publish({**INFO, "epoch": 10})  # deletes the one published before (7) and the one just before it (9)
    assert client.keys("wsepochgc:ws:rank:*") + client.keys("wsepochgc:ws:members:*") == []
    assert rv.claim_rank(10, "g0") == 1 and rv.members(10) == {1: "g0"}
    client.close()
