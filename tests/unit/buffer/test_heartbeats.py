"""A heartbeat another writer left in the run's Redis in the wrong shape is skipped and logged once; the readers
that run every step (the learner's `pool_metrics`) go on (buffer/stats.py)."""

from __future__ import annotations

import json
import logging

import pytest
import redis

from buffer.redis_buffer import ReplayBuffer
from buffer.stats import pool_metrics

MALFORMED = {
    "an-array": "[1, 2]",
    "metrics-a-list": json.dumps({"role": "generator", "metrics": [1], "time": 1.0}),
    "role-a-number": json.dumps({"role": 7, "metrics": {}, "time": 1.0}),
    "time-a-string": json.dumps({"role": "generator", "metrics": {}, "time": "now"}),
    "time-a-boolean": json.dumps({"role": "generator", "metrics": {}, "time": True}),
    "rate-a-string": json.dumps(
        {"role": "generator", "metrics": {"rollout/tokens_per_s": "fast"}, "time": 1.0}
    ),
    "version-a-word": json.dumps({"role": "generator", "metrics": {"rollout/version": "v3"}, "time": 1.0}),
}


@pytest.fixture
def buf(redis_url):
    buffer = ReplayBuffer(redis_url, "hb")
    buffer.heartbeat("gen-0", "generator", {"rollout/tokens_per_s": 12.5, "rollout/version": 3})
    buffer.heartbeat(
        "learner-0", "learner", {"status": "training"}
    )  # strings are fine outside the pool figures
    raw = redis.Redis.from_url(redis_url)
    for worker_id, body in MALFORMED.items():
        raw.sadd("hb:workers", worker_id)
        raw.set(f"hb:worker:{worker_id}", body)
    return buffer


def test_malformed_heartbeats_are_skipped_and_the_pool_row_still_made(buf, caplog):
    with caplog.at_level(logging.WARNING, logger="buffer.stats"):
        for _ in range(3):  # the learner reads them every step
            workers = buf.workers()
            assert sorted(w["worker_id"] for w in workers) == ["gen-0", "learner-0"]
            row = pool_metrics(workers)
            assert (
                row["pool/generators"] == 1
                and row["pool/tokens_per_s"] == 12.5
                and row["pool/version_max"] == 3
            )
    logged = [r.getMessage() for r in caplog.records if "skipping a heartbeat" in r.getMessage()]
    assert len(logged) == len(MALFORMED)  # once per worker, not once per read
    assert all(any(worker_id in line for line in logged) for worker_id in MALFORMED)
    assert any("rollout/tokens_per_s" in line for line in logged)
    assert buf.skipped_heartbeats == 3 * len(MALFORMED)
