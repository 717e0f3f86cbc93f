"""Redis coordination for weight sync: where the learner's store listens, who joined, which update is current, acks.

    rv = Rendezvous(redis_url, namespace)   # the one Redis client of weight sync; rv.close() when done

Learner rank 0 publishes the rendezvous (`{"addr", "port", "backend", "epoch", "timeout_s"}`); each engine claims
one rank per vLLM worker for that epoch (consecutive ranks from 1: a tensor-parallel engine of 2 workers takes two),
the learner closes the group once the engines it waits for have claimed (world size = 1 + ranks claimed, handed to
the members through the TCP store, `process_group.py`), and every worker joins the store-based process group. For
every new version the learner announces the bucket layout, broadcasts, and waits for one ack per engine.

Every rendezvous and update is also appended to a small Redis stream (`<namespace>:ws:events`): engines block on
it (`event_cursor`, then `wait_for_event`) and wake as soon as the learner publishes, rather than polling; the
learner's first broadcast cannot complete before they do. Acks go to a second stream (`<namespace>:ws:ack_events`),
which `wait_acks` blocks on the same way.

Engines announce themselves every couple of seconds (`announce_engine`, a key with a TTL): the learner forms each
new group from the engines alive at that moment, re-forms it when one appears or disappears (engines join and
leave a running run), and stops waiting for an ack from an engine whose announcement expired.

All keys live under `<namespace>:ws:` so one Redis can hold several runs. Values are JSON (never pickle).
A new `epoch` (the learner re-opened the group, e.g. after an engine died) tells engines to leave and re-join.
This is the only module of `weight_sync` that talks to Redis, through `buffer.connection`'s client (which rides out a
Redis restart and names Redis's errors: nothing here imports `redis`). Its keys stay here, behind this one interface,
rather than in `buffer/`: they are weight sync's own protocol (a store address, rank claims, acks), read by the
publisher and the engines' receiver only, and the buffer would otherwise have to know it.
"""

from __future__ import annotations

import json
import time
from typing import Any

from buffer.connection import connect
from buffer.guarded_json import MalformedJSON, decode_json

# Redis keys expire after this long without a refresh so a finished run leaves nothing behind forever.
_TTL_S = 7 * 24 * 3600
_ACKS_TTL_S = 3600
_POLL_S = 0.05
ENGINE_TTL_S = 6.0  # an engine that has not announced itself for this long is gone (it refreshes every ~2 s)


class EnginesGone(TimeoutError):
    """Engines of the group stopped announcing themselves while the learner waited for them."""


_EVENTS_KEPT = 64


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


_INFO_KEYS = {"addr", "port", "backend", "epoch", "timeout_s"}
_UPDATE_KEYS = {"version", "epoch", "buckets", "dtype"}


def _loads(raw: bytes | str | None, what: str, keys: set[str]) -> dict | None:
    """A JSON object read back from Redis holding `keys`, or None; MalformedJSON naming `what` otherwise."""
    if raw is None:
        return None
    value = decode_json(raw, what)
    if missing := keys - set(value):
        raise MalformedJSON(f"{what} lacks {sorted(missing)}; got keys {sorted(value)}")
    return value


# Claim ARGV[1] consecutive ranks for engine ARGV[2] in one step (KEYS: rank counter, members hash); returns the last.
# An engine without a name is named after its first rank.
_CLAIM_RANKS = """
local last = redis.call('INCRBY', KEYS[1], ARGV[1])
local first = last - tonumber(ARGV[1]) + 1
local name = ARGV[2]
if name == '' then name = 'rank' .. first end
for rank = first, last do
    redis.call('HSET', KEYS[2], rank, name)
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return last
"""


def describe_members(members: dict[int, str]) -> str:
    """`{1: "g0", 2: "g0", 3: "g1"}` -> "g0 (ranks 1-2), g1 (rank 3)": engines with the ranks their workers hold."""
    ranks: dict[str, list[int]] = {}
    for rank, worker_id in sorted(members.items()):
        ranks.setdefault(worker_id, []).append(rank)
    parts = []
    for worker_id, held in sorted(ranks.items(), key=lambda item: item[1][0]):
        span = f"rank {held[0]}" if len(held) == 1 else f"ranks {held[0]}-{held[-1]}"
        parts.append(f"{worker_id} ({span})")
    return ", ".join(parts) or "none"


def to_jsonable(obj: Any) -> Any:
    """Round-trip through JSON, as an announced update does (tuples become lists)."""
    return json.loads(json.dumps(obj))


class Rendezvous:
    """The weight-sync keys of one namespace in one Redis; owns its Redis client (`close()` it).

    Safe to share between threads (redis-py's client takes a connection from its pool per command).
    """

    def __init__(
        self, redis_url: str, namespace: str, reconnect_s: float = 60.0, socket_timeout_s: float = 10.0
    ):
        self.redis_url = redis_url
        self.namespace = namespace
        # rides out a Redis restart or a network cut; no reply is waited for longer than socket_timeout_s
        self._redis, self.reconnects = connect(redis_url, reconnect_s, socket_timeout_s)
        self._completed_version: int | None = None  # the last version whose acks `wait_acks` saw complete
        # versions `wait_acks` waited on since then (their waits failed): their ack sets go with the next completion
        self._waited_versions: set[int] = set()

    def close(self) -> None:
        """Close the Redis client's connections."""
        self._redis.close()

    def __enter__(self) -> Rendezvous:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Rendezvous(namespace={self.namespace!r})"

    def _key(self, *parts: object) -> str:
        return ":".join([self.namespace, "ws", *(str(p) for p in parts)])

    # the rendezvous and its epochs ---------------------------------------------------------------------------
    def publish(self, info: dict) -> None:
        """Learner rank 0: publish where its store listens.

        `info` needs addr, port, backend, epoch, timeout_s (the world size follows once the engines claimed)."""
        missing = _INFO_KEYS - set(info)
        if missing:
            raise ValueError(f"rendezvous info lacks {sorted(missing)}; got keys {sorted(info)}")
        epoch = int(info["epoch"])
        pipe = self._redis.pipeline()
        # A fresh epoch starts with a fresh rank counter and member table; the previous epochs' are nobody's any more
        # (the learner keeps its group's members itself): a run that re-forms its group at every evaluation would
        # otherwise keep two keys per epoch for the TTL.
        stale = {epoch, epoch - 1, self._published_epoch()} - {0, None}
        pipe.delete(
            *(self._key(kind, e) for e in sorted(stale) if e <= epoch for kind in ("rank", "members"))
        )
        pipe.set(self._key("rendezvous"), json.dumps(info), ex=_TTL_S)
        self._add_event(pipe, "rendezvous", info["epoch"])
        pipe.execute()

    def _published_epoch(self) -> int | None:
        """The epoch of the rendezvous published now (None when there is none or it does not parse)."""
        try:
            current = self.read()
        except MalformedJSON:
            return None
        return int(current["epoch"]) if current else None

    def read(self) -> dict | None:
        """The current rendezvous info, or None when no learner has published one."""
        return _loads(
            self._redis.get(self._key("rendezvous")),
            f"the weight-sync rendezvous ({self._key('rendezvous')})",
            _INFO_KEYS,
        )

    def clear(self) -> None:
        """Learner: withdraw the rendezvous (the group is closed; engines must not try to join it)."""
        self._redis.delete(self._key("rendezvous"))

    def next_epoch(self) -> int:
        """Learner: a new epoch number, never handed out before in this namespace (survives learner restarts)."""
        return int(self._redis.incr(self._key("epoch")))

    # members ------------------------------------------------------------------------------------------------
    def claim_rank(self, epoch: int, worker_id: str | None = None, workers: int = 1) -> int:
        """Engine: claim the next `workers` free ranks of `epoch` (one per vLLM worker of the engine); returns the
        first. `worker_id` is recorded for each of them to name the engine.

        The claim is one atomic step, so the ranks claimed at any moment are exactly 1..n: the learner closes the
        group at 1 + n members. An engine claiming after that gets ranks outside the group; its workers are told so
        when they connect (`group.make_group`) and it joins the learner's next epoch.
        """
        if workers < 1:
            raise ValueError(f"an engine claims one rank per worker, at least 1; got workers={workers}")
        last = self._redis.eval(
            _CLAIM_RANKS,
            2,
            self._key("rank", epoch),
            self._key("members", epoch),
            workers,
            worker_id or "",
            _TTL_S,
        )
        return int(last) - workers + 1

    def announce_engine(self, worker_id: str, ttl_s: float = ENGINE_TTL_S) -> None:
        """Engine: say it is alive and wants the learner's weights (refresh well within `ttl_s`). The learner forms
        each new group from the engines alive at that moment, so engines can join and leave a running run."""
        pipe = self._redis.pipeline()
        pipe.set(self._key("engine", worker_id), "1", px=int(ttl_s * 1000))
        pipe.sadd(self._key("engines"), worker_id)
        pipe.sadd(self._key("announced"), worker_id)
        pipe.expire(self._key("announced"), _TTL_S)
        pipe.expire(self._key("engines"), _TTL_S)
        pipe.execute()

    def withdraw_engine(self, worker_id: str) -> None:
        """Engine: leaving (a clean stop); the learner drops it from the next group at once."""
        self._redis.delete(self._key("engine", worker_id))

    def live_engines(self) -> set[str]:
        """Worker ids of the engines whose announcement has not expired."""
        ids = sorted(_text(w) for w in self._redis.smembers(self._key("engines")))
        if not ids:
            return set()
        alive = self._redis.mget([self._key("engine", w) for w in ids])
        gone = [w for w, a in zip(ids, alive, strict=True) if a is None]
        if gone:
            self._redis.srem(self._key("engines"), *gone)
        return {w for w, a in zip(ids, alive, strict=True) if a is not None}

    def members(self, epoch: int) -> dict[int, str]:
        """Ranks claimed in `epoch` (1..n, one per engine worker), mapped to the worker ids that claimed them."""
        raw = self._redis.hgetall(self._key("members", epoch))
        return dict(sorted((int(k), _text(v)) for k, v in raw.items()))

    def wait_members(self, epoch: int, n: int, timeout_s: float) -> dict[int, str]:
        """Learner: block until `n` engines claimed their ranks in `epoch`; returns every claimed rank (an engine of
        several workers holds several). TimeoutError saying who is there otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.members(epoch)
            engines = set(got.values())
            if len(engines) >= n:
                return got
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"weight sync epoch {epoch}: {len(engines)} of {n} engines joined within {timeout_s:.1f} s "
                    f"(joined: {sorted(engines) or 'none'}); are the generators running with the same "
                    f"Redis and namespace, and is num_engines right?"
                )
            time.sleep(_POLL_S)

    # updates and acks ---------------------------------------------------------------------------------------
    def announce_update(self, update: dict) -> None:
        """Learner: announce `{"version", "epoch", "buckets", "dtype"}`; engines broadcast-receive it next."""
        missing = _UPDATE_KEYS - set(update)
        if missing:
            raise ValueError(f"update lacks {sorted(missing)}; got keys {sorted(update)}")
        pipe = self._redis.pipeline()
        pipe.set(self._key("update"), json.dumps(update), ex=_TTL_S)
        self._add_event(pipe, "update", update["version"])
        pipe.execute()

    def latest_update(self) -> dict | None:
        """The last announced update, or None."""
        return _loads(
            self._redis.get(self._key("update")),
            f"the weight-sync update ({self._key('update')})",
            _UPDATE_KEYS,
        )

    def ack_update(self, version: int, worker_id: str) -> None:
        """Engine: say that `version` is loaded (called after `ws_receive` returned)."""
        key = self._key("acks", version)
        pipe = self._redis.pipeline()
        pipe.sadd(key, worker_id)
        pipe.expire(key, _ACKS_TTL_S)
        self._add_event(pipe, "ack", version, stream="ack_events")
        pipe.execute()

    def acked(self, version: int) -> set[str]:
        """Worker ids that acked `version`."""
        return {_text(m) for m in self._redis.smembers(self._key("acks", version))}

    def wait_acks(
        self, version: int, n: int, timeout_s: float, expected: dict[int, str] | None = None
    ) -> None:
        """Block until `n` engines acked `version`; raise TimeoutError naming the missing ones after `timeout_s`.

        `expected` (rank -> worker id, e.g. from `members`) lets the error name the engines that did not ack.
        """
        deadline = time.monotonic() + timeout_s
        self._waited_versions.add(version)
        acks_stream = self._key("ack_events")
        # taken before looking: an ack landing meanwhile still wakes the wait
        cursor = self._stream_cursor(acks_stream)
        while True:
            got = self.acked(version)
            if len(got) >= n:
                self._forget_acks_before(version)
                return
            if expected:
                # an engine that stopped announcing itself will never ack: fail now, not after the timeout
                # (a tensor-parallel engine holds several ranks: name it once)
                gone = sorted(set(expected.values()) - got - self.live_engines())
                if gone and self._announced(gone):
                    raise EnginesGone(
                        f"weight sync version {version}: engine(s) {', '.join(gone)} stopped answering (their "
                        f"announcement expired) before acking; acked: {sorted(got) or 'none'}"
                    )
            if time.monotonic() >= deadline:
                if expected:
                    missing = describe_members({r: w for r, w in expected.items() if w not in got})
                else:
                    missing = f"{n - len(got)} unnamed engine(s)"
                raise TimeoutError(
                    f"weight sync version {version}: {len(got)} of {n} engines acked within {timeout_s:.1f} s; "
                    f"missing: {missing}; acked: {sorted(got) or 'none'}"
                )
            # woken by the next ack (any version: then look again), or after at most a second (liveness)
            wait_s = min(1.0, max(0.001, deadline - time.monotonic()))
            cursor = self._wait_stream(acks_stream, cursor, wait_s)

    def _forget_acks_before(self, version: int) -> None:
        """Delete the ack sets of the version completed before `version` and of every version waited on since whose
        wait failed: nobody reads them any more. Without this a run kept one ack set per published version for
        `_ACKS_TTL_S` (an hour: hundreds of keys when a step takes seconds), and a publish that timed out (an engine
        too slow to ack, on a busy machine) still kept its set for the hour; now one stays, the last completed."""
        stale = (self._waited_versions | {self._completed_version}) - {version, None}
        if stale:
            self._redis.delete(*(self._key("acks", v) for v in sorted(stale)))
        self._completed_version = version
        self._waited_versions = set()

    def _announced(self, worker_ids: list[str]) -> bool:
        """Whether these engines ever announced themselves (engines without announcements, e.g. benchmark
        receivers, are only waited for)."""
        return set(worker_ids) <= self.announced_engines()

    def announced_engines(self) -> set[str]:
        """Every engine that ever announced itself in this namespace (alive or not)."""
        return {_text(w) for w in self._redis.smembers(self._key("announced"))}

    # announcements: engines block on them instead of polling -------------------------------------------------
    def event_cursor(self) -> str:
        """The id of the newest event (take it before reading the rendezvous/update keys, then wait from it)."""
        return self._stream_cursor(self._key("events"))

    def wait_for_event(self, cursor: str, timeout_s: float) -> str:
        """Block until a rendezvous or update is announced after `cursor` (at once if one already was), or until
        `timeout_s`; returns the cursor to wait from next. Engines wake within a Redis round trip of a publish
        instead of up to a poll interval later, while the learner's first broadcast is waiting for them."""
        return self._wait_stream(self._key("events"), cursor, timeout_s)

    def _add_event(self, pipe: Any, kind: str, value: object, stream: str = "events") -> None:
        """Append to one of the namespace's notification streams (`events`: rendezvous and updates, which engines
        wait on; `ack_events`: acks, which the learner waits on), so waiters block instead of polling."""
        key = self._key(stream)
        pipe.xadd(key, {"kind": kind, "value": str(value)}, maxlen=_EVENTS_KEPT, approximate=True)
        pipe.expire(key, _TTL_S)

    def _stream_cursor(self, key: str) -> str:
        newest = self._redis.xrevrange(key, count=1)
        if not newest:
            return "0-0"
        return _text(newest[0][0])

    def _wait_stream(self, key: str, cursor: str, timeout_s: float) -> str:
        """Block until an entry after `cursor` (at most `timeout_s`, and at most the client's `max_block_ms`, below
        its socket timeout: the callers wait again)."""
        block_ms = min(max(1, int(timeout_s * 1000)), self._redis.max_block_ms)
        got = self._redis.xread({key: cursor}, count=1, block=block_ms)
        if not got:
            return cursor
        return _text(got[0][1][-1][0])
