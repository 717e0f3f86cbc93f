"""Operations of `ReplayBuffer` that watch a run: worker heartbeats, the staleness histogram and `stats()`.

`stats()` is the one snapshot every view reads (`sr1 buffer watch`, Prometheus `/metrics`, the `sr1 run` live table
and report): keys are namespaced and cumulative over the run (`buffer/depth`, `buffer/staleness_mean`, ...).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

import numpy as np

from buffer import lua
from buffer.guarded_json import MalformedJSON, decode_json
from buffer.lua import GENERATORS, LEARNER
from buffer.memory import MIB

RATE_BUCKET_S = 5  # produced/consumed rates are counted in buckets of this many seconds ...
RATE_WINDOW_BUCKETS = 6  # ... and averaged over this many of them (30 s)
STALENESS_HIST = "buffer/staleness_hist/"  # + k: trained tokens that were k versions old
# How long a recorded step's call id is kept: a resent call comes within `buffer.reconnect_s`, and a first copy the
# network held back arrives, at the latest, when TCP gives up retransmitting it (about 15 min with Linux's defaults)
_RECORDED_TTL_S = 1200
log = logging.getLogger(__name__)


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# the pool's figures the learner logs beside each step (metrics.jsonl, wandb): summed over workers, or averaged
_POOL_SUMS = (
    "rollout/tokens_per_s",
    "rollout/tool_calls_per_s",
    "rollout/inflight_trajectories",
    "rollout/groups_done",
    "rollout/groups_failed",
    "rollout/tool_errors_total",
    "rollout/eval_errors",
    "rollout/groups_given_back",
    "rollout/tool_pauses",
    "rollout/busy_s",
    "rollout/uptime_s",
)
_POOL_MEANS = ("rollout/idle_fraction", "rollout/reward_mean_60s", "rollout/tool_calls_per_traj_60s")
_POOL_NUMBERS = (
    *_POOL_SUMS,
    *_POOL_MEANS,
    "rollout/version",
)  # what a generator's heartbeat must give as numbers
_MAX_LOGGED_HEARTBEATS = 64  # workers whose malformed heartbeats are logged (once each)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_heartbeat(body: bytes | str, worker_id: str, now: float) -> dict[str, Any]:
    """A heartbeat as `workers()` returns it (with `age_s`), or MalformedJSON naming what is wrong: anyone who reaches
    the run's Redis can write one, and the learner reads them every step (`pool_metrics`)."""
    what = f"the heartbeat of worker {worker_id}"
    info = decode_json(body, what)
    role, metrics, sent = info.get("role"), info.get("metrics", {}), info.pop("time", now)
    if not isinstance(role, str) or not isinstance(metrics, dict) or not _is_number(sent):
        raise MalformedJSON(f"{what} must hold a role (a string), metrics (an object) and a time (a number)")
    if role == "generator":
        wrong = [key for key in _POOL_NUMBERS if key in metrics and not _is_number(metrics[key])]
        if wrong:
            raise MalformedJSON(f"{what} gives {', '.join(wrong)} as something other than a number")
    info["worker_id"] = worker_id
    info["age_s"] = max(0.0, now - float(sent))
    return info


def pool_metrics(heartbeats: list[dict[str, Any]]) -> dict[str, float]:
    """One row for the whole generator pool from its workers' heartbeats (`ReplayBuffer.workers()`): the
    `rollout/...` figures each generator worker posts, summed or averaged into `pool/...`."""
    metrics = [w.get("metrics", {}) for w in heartbeats if w.get("role") == "generator"]
    out: dict[str, float] = {"pool/generators": len(metrics)}
    if not metrics:
        return out
    for key in _POOL_SUMS:
        out["pool/" + key.split("/", 1)[1]] = float(sum(m.get(key, 0.0) for m in metrics))
    for key in _POOL_MEANS:
        out["pool/" + key.split("/", 1)[1]] = float(sum(m.get(key, 0.0) for m in metrics) / len(metrics))
    out["pool/paused"] = float(sum(1 for m in metrics if m.get("rollout/state") == "paused"))
    versions = [int(m.get("rollout/version", 0)) for m in metrics]
    out["pool/version_min"], out["pool/version_max"] = min(versions), max(versions)
    return out


class RunStats:
    """Mixed into `ReplayBuffer` (buffer/redis_buffer.py), whose `_redis`, `key()` and settings it uses."""

    skipped_heartbeats = 0  # malformed heartbeats `workers()` left out (each read counts)
    _logged_heartbeats: frozenset[str] = frozenset()  # workers whose malformed heartbeat was logged

    # -- heartbeats -----------------------------------------------------------------------------------------

    def heartbeat(self, worker_id: str, role: str, metrics: dict) -> None:
        """Post a worker's heartbeat (TTL heartbeat_ttl_s). Sent again: the same body is set again."""
        body = json.dumps(
            {"worker_id": worker_id, "role": role, "metrics": metrics, "time": time.time()}, default=str
        )
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(self.key("worker", worker_id), body, px=int(self.heartbeat_ttl_s * 1000))
        pipe.sadd(self.key("workers"), worker_id)
        pipe.execute()

    def workers(self) -> list[dict]:
        """Live workers (heartbeat within heartbeat_ttl_s): worker_id, role, metrics, age_s."""
        ids = sorted(_s(w) for w in self._redis.smembers(self.key("workers")))
        if not ids:
            return []
        bodies = self._redis.mget([self.key("worker", w) for w in ids])
        now = time.time()
        live, dead = [], []
        for worker_id, body in zip(ids, bodies, strict=True):
            if body is None:
                dead.append(worker_id)
                continue
            try:
                live.append(parse_heartbeat(body, worker_id, now))
            except MalformedJSON as err:  # skipped, not a crash of every reader; logged once per worker
                self.skipped_heartbeats += 1
                logged = self._logged_heartbeats
                if worker_id not in logged and len(logged) < _MAX_LOGGED_HEARTBEATS:
                    self._logged_heartbeats = logged | {worker_id}
                    log.warning(
                        "skipping a heartbeat (further ones of this worker are skipped silently): %s", err
                    )
        if dead:
            self._redis.srem(self.key("workers"), *dead)
        return live

    def dead_letters(self, count: int = 100) -> list[dict[str, str]]:
        """The newest `count` dead letters, oldest first: reason, gid, stream (and entry_id where known)."""
        entries = self._redis.xrevrange(self.key("dead"), "+", "-", count=count)
        fields = ("reason", "gid", "stream", "entry_id")
        return [
            {name: _s(body[name.encode()]) for name in fields if name.encode() in body}
            for _, body in reversed(entries)
        ]

    # -- monitoring -----------------------------------------------------------------------------------------

    def record_consumed(self, staleness: list[int] | np.ndarray) -> None:
        """Add one step's per-token staleness (consuming version - token version) to the histogram. Sent again after
        a lost reply it adds nothing: the first run records the call's id (buffer/lua.py), kept for 20 minutes in one
        sorted set, so the keys do not grow with the steps."""
        values = np.asarray(staleness, dtype=np.int64).ravel()
        if values.size == 0:
            return
        if values.min() < 0:
            raise ValueError(f"staleness must be >= 0, got min {int(values.min())}")
        counts = np.bincount(values)
        args: list[Any] = [_RECORDED_TTL_S, uuid.uuid4().hex, f"{time.time():.3f}"]
        for value in np.nonzero(counts)[0]:
            args += [int(value), int(counts[value])]
        keys = [self.key("staleness"), self.key("staleness", "recorded")]
        self._script(lua.RECORD_CONSUMED, keys, args)

    def memory_gauges(self) -> dict[str, Any]:
        """Redis's memory for the views: used and maxmemory in MiB (maxmemory 0: no limit), and whether the prompt
        feeder pauses for it (1) or not (0); None where this user may not read INFO."""
        memory = self.memory()
        if memory is None:
            return {
                "buffer/redis_used_mb": None,
                "buffer/redis_maxmemory_mb": None,
                "buffer/memory_paused": None,
            }
        return {
            "buffer/redis_used_mb": memory.used / MIB,
            "buffer/redis_maxmemory_mb": memory.maxmemory / MIB,
            "buffer/memory_paused": int(self.release_pause_reason(memory) is not None),
        }

    def staleness_histogram(self) -> dict[int, int]:
        raw = self._redis.hgetall(self.key("staleness"))
        return dict(sorted((int(k), int(v)) for k, v in raw.items()))

    def stats(self) -> dict[str, Any]:
        """A flat snapshot with namespaced keys (`buffer/depth`, `buffer/staleness_max`, ...), cheap enough to poll."""
        now = time.time()
        bucket = int(now // RATE_BUCKET_S)
        buckets = list(range(bucket - RATE_WINDOW_BUCKETS + 1, bucket + 1))
        pipe = self._redis.pipeline(transaction=False)
        pipe.xlen(self.key("prompts"))
        pipe.xpending(self.key("prompts"), GENERATORS)
        pipe.xlen(self.key("groups"))
        pipe.xpending(self.key("groups"), LEARNER)
        pipe.zcard(self.key("inflight"))
        pipe.hgetall(self.key("counters"))
        pipe.get(self.key("version"))
        pipe.get(self.key("version_time"))
        pipe.xlen(self.key("dead"))
        for name in ("produced", "consumed"):
            pipe.mget([self.key("rate", name, str(b)) for b in buckets])
        pipe.hgetall(self.key("staleness"))
        pipe.hlen(self.key("trained"))
        pipe.hgetall(self.key("staleness_bounds"))
        (
            prompts_len,
            prompts_pending,
            groups_len,
            groups_pending,
            inflight,
            counters,
            version,
            version_time,
            dead,
            produced_buckets,
            consumed_buckets,
            staleness,
            trained,
            bounds,
        ) = pipe.execute()
        counters = {_s(k): int(v) for k, v in counters.items()}
        window_s = (RATE_WINDOW_BUCKETS - 1) * RATE_BUCKET_S + (now - bucket * RATE_BUCKET_S)
        leased = int(prompts_pending["pending"])
        taken = int(groups_pending["pending"])  # taken and not acked: held for a step, or trained
        trained = min(int(trained), taken)  # their entries left the stream (only the pending entry stays)
        out: dict[str, Any] = {
            # where the released, not yet acked groups are: the three add up to buffer/inflight_groups
            "buffer/generating_groups": prompts_len,
            "buffer/queued_groups": groups_len,
            "buffer/trained_unacked": trained,
            "buffer/depth": groups_len - (taken - trained),
            "buffer/taken_unacked": taken,
            "buffer/pending_prompts": prompts_len - leased,
            "buffer/leased_prompts": leased,
            "buffer/inflight_groups": inflight,
            "buffer/released": counters.get("released", 0),
            "buffer/produced": counters.get("produced", 0),
            "buffer/consumed": counters.get("consumed", 0),
            "buffer/dropped_groups": counters.get("dropped", 0),
            "buffer/malformed": counters.get("malformed", 0),
            "buffer/oversized": counters.get("oversized", 0),
            "buffer/poison_prompts": counters.get("poison_prompts", 0),
            "buffer/failed_prompts": counters.get("failed_prompts", 0),
            "buffer/untrainable": counters.get("untrainable", 0),
            "buffer/abandoned_groups": counters.get("abandoned", 0),
            "buffer/duplicates": counters.get("duplicates", 0),
            "buffer/duplicate_releases": counters.get("duplicate_releases", 0),
            "buffer/dead_letters": dead,
            "buffer/produced_per_s": sum(int(x or 0) for x in produced_buckets) / window_s,
            "buffer/consumed_per_s": sum(int(x or 0) for x in consumed_buckets) / window_s,
            "buffer/version": int(version) if version is not None else 0,
            "buffer/version_age_s": now - float(version_time) if version_time is not None else None,
        }
        # the bound prompts released at the current version get (the latest recorded at or before it; None before
        # a learner recorded one)
        bounds = {int(k): int(v) for k, v in bounds.items()}
        current = [v for v in bounds if v <= out["buffer/version"]]
        out["buffer/staleness_bound"] = bounds[max(current)] if current else None
        out |= self.memory_gauges()
        hist = {int(k): int(v) for k, v in staleness.items()}
        total = sum(hist.values())
        # every token trained so far in this run (the learner's `staleness/*` are per batch)
        out["buffer/staleness_tokens"] = total
        out["buffer/staleness_mean"] = sum(k * v for k, v in hist.items()) / total if total else 0.0
        out["buffer/staleness_max"] = max(hist) if hist else 0
        for k in sorted(hist):
            out[f"{STALENESS_HIST}{k}"] = hist[k]
        return out
