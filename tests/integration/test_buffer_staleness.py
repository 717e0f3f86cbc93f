"""Property test of admission + batch assembly with real Redis and concurrent, randomly slow generators.

For several (max_staleness, groups_per_step) settings, producer threads (some dying with leased prompts, one
finishing after its lease expired) race a feeder thread and a learner that restarts twice (same consumer name:
pending entries re-delivered; new name: a dead learner's entries reclaimed after learner_lease_s). Checked:
every consumed group satisfies u - release_version <= max_staleness (and so does every token), released never
exceeds (max_staleness + version + 1) * groups_per_step, and every released group is consumed exactly once.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pytest

from buffer.admission import BatchAssembler, PromptFeeder
from buffer.redis_buffer import ReplayBuffer
from buffer.staleness import admission_limit
from fakes.groups import make_group, make_prompt
from tests.timing import scaled

LEASE_S = 0.3
LEARNER_LEASE_S = 0.4


def open_buffer(url: str) -> ReplayBuffer:
    return ReplayBuffer(url, "prop", lease_s=LEASE_S, learner_lease_s=LEARNER_LEASE_S)


def producer(
    url: str, name: str, seed: int, stop: threading.Event, errors: list, mode: str = "normal"
) -> None:
    rng = random.Random(seed)
    buf = open_buffer(url)
    try:
        while not stop.is_set():
            claimed = buf.claim_prompts(name, rng.randint(1, 3), block_ms=20)
            if mode == "dies" and claimed:
                return  # dead with leased prompts: the others must reclaim them
            for c in claimed:
                if mode == "zombie":
                    time.sleep(LEASE_S * 1.5)  # lease expired meanwhile: a second run may finish it first
                    mode = "normal"
                else:
                    time.sleep(rng.choice([0, 0, 0.002, 0.01, 0.04]))
                version = buf.version()  # tokens are sampled at the version current when generated
                group = make_group(
                    c.prompt, n=2, prompt_len=3, response_len=6, version=version, worker_id=name
                )
                buf.put_group(group, c.entry_id)
    except Exception as err:  # surfaced by the test
        errors.append(err)
    finally:
        buf.close()


def feeder_loop(feeder: PromptFeeder, stop: threading.Event, errors: list) -> None:
    try:
        while not stop.is_set() and not feeder.exhausted:
            feeder.pump()
            time.sleep(0.002)
    except Exception as err:
        errors.append(err)


@pytest.mark.parametrize(("max_staleness", "groups_per_step", "steps"), [(0, 3, 8), (1, 4, 8), (3, 2, 12)])
def test_staleness_bound_and_exactly_once_under_concurrency(redis_url, max_staleness, groups_per_step, steps):
    s, g = max_staleness, groups_per_step
    dataset = [make_prompt(i) for i in range(steps * g)]
    learner_buf = open_buffer(redis_url)
    feeder = PromptFeeder(open_buffer(redis_url), iter(dataset), groups_per_step=g, max_staleness=s)
    stop, errors = threading.Event(), []
    threads = [threading.Thread(target=feeder_loop, args=(feeder, stop, errors))]
    modes = ["dies", "zombie", "normal", "normal", "normal"]
    threads += [
        threading.Thread(target=producer, args=(redis_url, f"gen-{i}", 1000 * s + i, stop, errors, mode))
        for i, mode in enumerate(modes)
    ]
    for t in threads:
        t.start()
    consumed: Counter[str] = Counter()
    assembler = BatchAssembler(learner_buf, groups_per_step=g, max_staleness=s)
    try:
        u, restarted = 0, set()
        while u < steps:
            released = learner_buf.released_count()  # read before the version: both only grow
            assert released <= admission_limit(learner_buf.version(), groups_per_step=g, max_staleness=s)
            batch = assembler.next_batch(u, timeout_s=scaled(20))
            assert len(batch) == g, (
                u,
                len(batch),
                learner_buf.stats(),
                learner_buf.inflight(),
                [t.group.group_id for t in assembler.held],
            )
            for t in batch:
                assert u - t.group.release_version <= s, (u, t.group.group_id, t.group.release_version)
                assert u - t.group.min_version() <= s  # per token: versions >= release_version
            if u in (steps // 3, 2 * steps // 3) and u not in restarted:
                restarted.add(u)
                # the learner crashes before acking this step; the replacement redoes the step
                name = "learner-0" if u == steps // 3 else "learner-1"
                assembler = BatchAssembler(
                    open_buffer(redis_url), groups_per_step=g, max_staleness=s, consumer=name
                )
                if name == "learner-1":
                    time.sleep(LEARNER_LEASE_S)  # learner-0's entries become reclaimable
                continue
            consumed.update(t.group.group_id for t in batch)
            assembler.buffer.ack([t.entry_id for t in batch])
            learner_buf.publish_version(u + 1)
            u += 1
        assert not errors, errors
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=scaled(10))
    assert not errors, errors
    assert consumed == Counter(p.group_id for p in dataset)  # each released group consumed exactly once
    stats = learner_buf.stats()
    assert stats["buffer/released"] == len(dataset) == stats["buffer/consumed"]
    assert stats["buffer/inflight_groups"] == 0 and stats["buffer/depth"] == 0
    assert stats["buffer/taken_unacked"] == 0 and stats["buffer/malformed"] == 0
    assert stats["buffer/produced"] == len(dataset)  # the zombie's late copy, if any, was a counted duplicate
