"""The Redis replay buffer of one run: prompts to generators, finished groups to the learner, version, heartbeats.

The buffer is the one module that talks to Redis for a run (the weight-sync rendezvous keeps its own keys); every
other part calls its named operations.

    buf = open_buffer(cfg.buffer)                      # or ReplayBuffer("redis://127.0.0.1:6379/0", namespace="run1")
    buf.release_prompts(prompts)                       # feeder (learner rank 0), see buffer/admission.py
    claimed = buf.claim_prompts("gen-0", 4)            # generator: a claim is a lease
    buf.put_group(group, claimed[0].entry_id)          # atomic: XADD the group + XACK/XDEL the prompt
    taken = buf.take(8)                                # learner: oldest first
    buf.ack([t.entry_id for t in taken])               # after the step that used them is durable

Keys, all under `<namespace>:`
    prompts        stream, consumer group "generators" (a pending entry is a lease; idle > lease_s is reclaimed)
    groups         stream, consumer group "learner" (pending = taken, not acked; a dead learner's are reclaimed);
                   an entry holds the group_id ("gid") and its msgpack payload ("d")
    dead           dead-letter stream: prompts and groups that left for good (malformed, oversized, poison, failed,
                   untrainable), each with its reason; `counters` counts them by reason
    prompt_errors  hash: prompt entry id -> the error of its last failed attempt (the reason if it is dead-lettered)
    inflight       sorted set group_id -> release_version: released and not yet acked (admission + assembly)
    trained        hash: group entry id -> group_id of each group a step trained on, waiting for the checkpoint that
                   lets it be acked; its payload has left the stream already (only the pending entry remains)
    durable        sorted set group_id -> the version of the checkpoint that acked it, until older checkpoints are
                   pruned (a resume that finds a checkpoint torn releases its groups again: buffer/durable.py)
    released_ids   sorted set group_id -> feeder position: a re-released id is skipped (e.g. after a learner resume)
    put_ids        sorted set group_id -> release version: a second put of a group is a counted duplicate, never
                   delivered. Both forget what `forgotten_below` (hash: position, version) stands for once a
                   checkpoint is written, so they hold about one checkpoint interval of ids (buffer/group_ids.py)
    counters       hash: released, produced, consumed, dropped (dynamic sampling), abandoned (dead-lettered while in
                   flight), malformed, duplicates, ...
    staleness      hash: per-token staleness -> count, reported by the learner
    version        the published policy version
    worker:<id>    a worker's heartbeat (JSON, TTL heartbeat_ttl_s); `workers` is the set of known ids
    rate:<name>:<bucket>   event counts per RATE_BUCKET_S seconds, for produced/consumed rates
    eval:*         evaluation requests and results (buffer/evaluations.py)

Every write that must not be torn (put a group and finish its prompt; ack and leave the in-flight set) is one Lua
script (buffer/lua.py), so a crash between two calls never loses or duplicates a group. Every write is also safe to
send again when its reply was lost (each method says how; docs/measurements/network-and-redis.md, "Lost replies",
lists them all).
This module holds the streams' common steps and the group side (put, take, ack, trained, recalled). The rest is
mixed in: prompt leases (claim, renew, fail, give back) are in buffer/prompt_leases.py, dead letters in
buffer/dead_letters.py, releases and the remembered group ids in buffer/group_ids.py, durable groups in
buffer/durable.py, heartbeats, the staleness histogram and `stats()` in buffer/stats.py, evaluation requests in
buffer/evaluations.py, Redis's memory (the release pause, the eviction policy) in buffer/memory.py.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import redis

from buffer import lua
from buffer.codec import CodecError, decode_group, encode_group, encode_prompt
from buffer.connection import connect
from buffer.dead_letters import DeadLetters
from buffer.durable import DurableGroups
from buffer.evaluations import EvaluationRequests
from buffer.group_ids import GroupIds
from buffer.memory import RedisMemory
from buffer.prompt_leases import PromptLeases
from buffer.records import Group, PromptRecord
from buffer.settings import BufferConfig
from buffer.stats import RATE_BUCKET_S, RATE_WINDOW_BUCKETS, RunStats, _s

log = logging.getLogger(__name__)

GENERATORS, LEARNER = lua.GENERATORS, lua.LEARNER


@dataclass
class TakenGroup:
    entry_id: str
    group: Group
    payload: bytes  # the group as it came from Redis (the learner forwards it to its other ranks as is)


class BufferConfigError(ValueError):
    """The buffer cannot be opened as configured (no Redis URL)."""


def open_buffer(cfg: BufferConfig, url: str | None = None) -> ReplayBuffer:
    """The run's buffer: Redis at `url` if given (a command line's `--redis-url`), else `cfg.redis_url`."""
    url = url or cfg.redis_url
    if not url:
        raise BufferConfigError(
            "no Redis URL: pass --redis-url or set buffer.redis_url (redis://host:port/db); `sr1 run` starts one"
        )
    return ReplayBuffer.from_config(cfg, url)


class ReplayBuffer(
    PromptLeases, DeadLetters, EvaluationRequests, RunStats, RedisMemory, DurableGroups, GroupIds
):
    """One run's buffer in Redis (sync redis-py; async callers use `asyncio.to_thread`)."""

    def __init__(
        self,
        url: str,
        namespace: str = "sr1",
        *,
        lease_s: float = 120,
        learner_lease_s: float = 600,
        heartbeat_ttl_s: float = 15,
        max_payload_bytes: int = 64 << 20,
        max_prompt_deliveries: int = 5,
        reconnect_s: float = 60.0,
        socket_timeout_s: float = 10.0,
        memory_high_water: float = 0.9,
    ):
        self.url = url
        self.namespace = namespace
        self.lease_s = float(lease_s)
        self.learner_lease_s = float(learner_lease_s)
        self.heartbeat_ttl_s = float(heartbeat_ttl_s)
        self.max_payload_bytes = int(max_payload_bytes)
        self.max_prompt_deliveries = int(max_prompt_deliveries)
        self.memory_high_water = float(memory_high_water)
        self.reconnect_s, self.socket_timeout_s = float(reconnect_s), float(socket_timeout_s)
        # a Redis restart or a network cut is ridden out for `reconnect_s`; `reconnects` counts the connection failures
        self._redis, self.reconnects = connect(url, reconnect_s, socket_timeout_s)
        self._gid_of: dict[str, str] = {}  # group entry id -> group_id for entries this instance handed out
        # stream -> monotonic time of the last scan for expired entries
        self._last_reclaim: dict[str, float] = {}
        self._rate_ttl = RATE_BUCKET_S * (RATE_WINDOW_BUCKETS + 2)
        for stream, group in ((self.key("prompts"), GENERATORS), (self.key("groups"), LEARNER)):
            try:
                self._redis.xgroup_create(stream, group, id="0", mkstream=True)
            except redis.ResponseError as err:
                if "BUSYGROUP" not in str(err):
                    raise
        self.check_eviction_policy()
        self._upgrade_id_sets()

    @classmethod
    def from_config(cls, cfg: BufferConfig, url: str) -> ReplayBuffer:
        return cls(
            url,
            cfg.namespace,
            lease_s=cfg.lease_s,
            learner_lease_s=cfg.learner_lease_s,
            heartbeat_ttl_s=cfg.heartbeat_ttl_s,
            max_payload_bytes=int(cfg.max_payload_mb * (1 << 20)),
            max_prompt_deliveries=cfg.max_prompt_deliveries,
            reconnect_s=cfg.reconnect_s,
            socket_timeout_s=cfg.socket_timeout_s,
            memory_high_water=cfg.memory_high_water,
        )

    def key(self, *parts: str) -> str:
        return ":".join((self.namespace, *parts))

    def close(self) -> None:
        self._redis.close()

    def _script(self, source: str, keys: list[str], args: list[Any], client: Any = None) -> Any:
        """EVAL (not EVALSHA: the body is small, Redis caches it by digest, and there is no NOSCRIPT to handle
        inside a MULTI after a Redis restart)."""
        return (client or self._redis).eval(source, len(keys), *keys, *args)

    def _rate_key(self, name: str) -> str:
        return self.key("rate", name, str(int(time.time() // RATE_BUCKET_S)))

    # -- expired leases, on both streams (prompt leases: buffer/prompt_leases.py) ------------------------------

    def _reclaim(
        self,
        stream: str,
        group: str,
        consumer: str,
        min_idle_s: float,
        count: int,
        skip_own: bool,
        throttle: bool,
    ):
        """Claim up to `count` entries of other consumers idle for at least `min_idle_s`.

        XPENDING with IDLE finds them wherever they sit in the pending list; XCLAIM with the same min-idle makes
        two reclaimers race safely (only one gets each entry). Returns (entry id, fields, times delivered before).
        """
        # the scan is cheap but a round trip: on the learner's hot path, a few per lease period are plenty
        # (prompts are not throttled: a prompt given back by `release_claims` must be taken at once)
        now = time.monotonic()
        if throttle and now - self._last_reclaim.get(stream, -1e9) < min(1.0, min_idle_s / 4):
            return []
        min_idle_ms = int(min_idle_s * 1000)
        pending = self._redis.xpending_range(stream, group, "-", "+", count, idle=min_idle_ms)
        if len(pending) < count:  # a full page may have more behind it: look again next call
            self._last_reclaim[stream] = now
        delivered = {
            p["message_id"]: int(p["times_delivered"])
            for p in pending
            if not (skip_own and _s(p["consumer"]) == consumer)
        }
        if not delivered:
            return []
        entries = self._redis.xclaim(stream, group, consumer, min_idle_ms, list(delivered))
        return [(eid, fields, delivered.get(eid, 0)) for eid, fields in entries if fields]

    # -- groups: generators -> learner ----------------------------------------------------------------------

    def put_group(self, group: Group, prompt_entry_id: str = "") -> bool:
        """Add a finished group and finish its prompt, atomically. False if the group was put before
        (counted as a duplicate) or its payload is over `max_payload_bytes` (dead-lettered, counted).
        Sent again after a lost reply: the group id is in `put_ids` (or below the watermark: buffer/group_ids.py), so
        the second copy is removed inside the same transaction (never delivered) and counted as a duplicate; the
        retry returns False."""
        return self.put_groups([(group, prompt_entry_id)])[0]

    def put_groups(self, items: Iterable[tuple[Group, str]]) -> list[bool]:
        """`put_group` for many groups in one MULTI (one round trip, atomic as a whole). Waits first while Redis is
        nearly full (`wait_for_put_room`: back-pressure, buffer/memory.py)."""
        self.wait_for_put_room()
        payloads = [(group, encode_group(group), pid) for group, pid in items]
        ok = [True] * len(payloads)
        keys = [
            self.key("groups"),
            self.key("prompts"),
            self.key("put_ids"),
            self.key("counters"),
            self._rate_key("produced"),
            self.key("inflight"),
            self.key("forgotten_below"),
        ]
        pipe = self._redis.pipeline(transaction=True)
        sent = []  # (payload index, position of its script reply in the transaction)
        for i, (group, payload, pid) in enumerate(payloads):
            if len(payload) > self.max_payload_bytes:
                ok[i] = False
                self._reject_oversized(pipe, group, payload, pid)
                continue
            if pid:
                pipe.hdel(self.key("prompt_errors"), pid)
            # XADD outside the script (a large payload costs more through Lua); PUT removes it again at once if the
            # group id was put before, inside the same MULTI, so no reader ever sees a second copy
            pipe.xadd(keys[0], {"gid": group.group_id, "d": payload})
            sent.append((i, len(pipe)))
            args = [group.group_id, pid or "", self._rate_ttl, int(group.release_version)]
            self._script(lua.PUT, keys, args, client=pipe)
        results = pipe.execute()
        for i, position in sent:
            if not results[position]:
                ok[i] = False
                log.info("group %s was put before; counted as a duplicate", payloads[i][0].group_id)
        return ok

    def dead_letter_taken(self, taken: TakenGroup, reason: str) -> None:
        """A group the learner took and cannot train (e.g. a trajectory over its token budget): dead-lettered with
        `reason` (counted as `untrainable`), never re-delivered; admission releases another prompt in its place."""
        self._gid_of.pop(taken.entry_id, None)
        fields = {b"gid": taken.group.group_id.encode(), b"d": taken.payload}
        self._dead_letter(self.key("groups"), LEARNER, taken.entry_id, fields, reason, counter="untrainable")

    def _read_new(self, stream: str, group: str, consumer: str, count: int, block_ms: int) -> list:
        """Entries never delivered to `group` yet (XREADGROUP `>`); `block_ms <= 0` does not wait, and no call
        blocks longer than the client's `max_block_ms` (below its socket timeout)."""
        block = min(block_ms, self._redis.max_block_ms) if block_ms > 0 else None
        got = self._redis.xreadgroup(group, consumer, {stream: ">"}, count=count, block=block)
        return [entry for _, stream_entries in got or [] for entry in stream_entries]

    def _decode_entries(self, entries, stream: str) -> list[TakenGroup]:
        taken = []
        for eid, fields in entries:
            if not fields:  # deleted while pending: nothing to deliver
                continue
            payload = fields.get(b"d")
            try:
                if payload is None:
                    raise CodecError("stream entry has no 'd' (payload) field")
                if len(payload) > self.max_payload_bytes:
                    raise CodecError(
                        f"payload of {len(payload)} bytes exceeds max_payload_bytes={self.max_payload_bytes}"
                    )
                group = decode_group(payload)
            except CodecError as err:
                self._dead_letter(stream, LEARNER, eid, fields, str(err))
                continue
            entry_id = _s(eid)
            self._gid_of[entry_id] = group.group_id
            taken.append(TakenGroup(entry_id, group, bytes(payload)))
        return taken

    def take(self, count: int, consumer: str = "learner-0", block_ms: int = 1000) -> list[TakenGroup]:
        """Up to `count` finished groups, oldest first: a dead learner's unacked entries (idle > learner_lease_s)
        first, then new ones. Malformed payloads are counted and dead-lettered, never raised.
        `block_ms` <= 0 does not wait for new groups. A take whose reply was lost leaves groups delivered to
        `consumer` that it never saw: the batch assembler reads its pending entries again after a reconnect."""
        stream = self.key("groups")
        reclaimed = self._reclaim(
            stream, LEARNER, consumer, self.learner_lease_s, count, skip_own=True, throttle=True
        )
        entries = [(eid, fields) for eid, fields, _ in reclaimed]
        if len(entries) < count:
            entries += self._read_new(stream, LEARNER, consumer, count - len(entries), block_ms)
        return self._decode_entries(entries, stream)

    def renew_taken(self, consumer: str, entry_ids: list[str]) -> None:
        """Reset the idle time of groups a live learner holds for a later step, so nobody reclaims them (sent again:
        reset again)."""
        if entry_ids:
            self._redis.xclaim(self.key("groups"), LEARNER, consumer, 0, entry_ids, justid=True)

    def ack(self, entry_ids: list[str], counter: str = "", client: Any = None) -> None:
        """Finish taken groups: XACK + XDEL them and remove them from the in-flight set and the trained hash, in one
        script (`counter`, if given, also counts the groups acked: `dropped`; `client`, a pipeline to run it in).
        Sent again after a lost reply it acks nothing and counts nothing (every count is of what XACK acked). It
        works in a Redis at maxmemory."""
        if not entry_ids:
            return
        args: list[Any] = [self._rate_ttl, counter]
        for eid in entry_ids:
            args += [eid, self._gid_of.pop(eid, "")]
        keys = [
            self.key("groups"),
            self.key("inflight"),
            self.key("counters"),
            self._rate_key("consumed"),
            self.key("trained"),
        ]
        self._script(lua.ACK, keys, args, client=client)

    def drop(self, entry_ids: list[str]) -> None:
        """Finish taken groups that no step will train on (dynamic sampling), counting them as `dropped` in the same
        script: the prompt feeder releases that many more prompts (buffer/admission.py). Sent again, it counts
        nothing: a `dropped` counted twice would let the feeder release past the staleness bound."""
        self.ack(entry_ids, counter="dropped")

    def dropped_count(self) -> int:
        """Groups dropped by dynamic sampling so far (each one leaves room for one more release)."""
        return int(self._redis.hget(self.key("counters"), "dropped") or 0)

    def replaced_count(self) -> int:
        """Released groups that left for good without being trained: dropped by dynamic sampling or dead-lettered
        while in flight (`abandoned`). Each one leaves room for one more release (buffer/admission.py)."""
        dropped, abandoned = self._redis.hmget(self.key("counters"), "dropped", "abandoned")
        return int(dropped or 0) + int(abandoned or 0)

    def recall_trained(self, prompt_of: Callable[[str], PromptRecord], version: int) -> list[str]:
        """Generate again the groups trained in steps that a learner crash lost (trained, never acked): their
        entries go, and their prompts are released anew at `version`, in one script. Training them again as they
        are would break the staleness bound by the number of lost steps. Returns their group ids.
        `prompt_of(group_id)` gives each group's prompt (the feeder's dataset). Sent again after a lost reply it
        recalls nothing (only groups still in the trained hash are recalled), so no prompt is released twice."""
        trained = {_s(eid): _s(gid) for eid, gid in self._redis.hgetall(self.key("trained")).items()}
        if not trained:
            return []
        args: list[Any] = []
        for eid, gid in trained.items():
            prompt = dataclasses.replace(prompt_of(gid), release_version=version)
            args += [eid, gid, int(version), encode_prompt(prompt)]
        keys = [self.key(k) for k in ("groups", "inflight", "put_ids", "trained", "counters", "prompts")]
        self._script(lua.RECALL, keys, args)
        return list(trained.values())

    def mark_trained(self, entry_ids: list[str]) -> None:
        """Taken groups a step trained on; they wait for the checkpoint that makes them durable, then `ack`. Their
        payloads leave Redis now (only the pending entry and the group id stay): the memory a run holds in Redis
        is that of the groups not trained yet, whatever the checkpoint interval. Sent again: the same ids are set
        again. It works in a Redis at maxmemory (it frees memory first)."""
        if entry_ids:
            self._script(lua.MARK_TRAINED, [self.key("groups"), self.key("trained")], list(entry_ids))

    def pending_groups(self, consumer: str) -> list[TakenGroup]:
        """Entries `consumer` took and did not ack (after a learner restart), oldest first."""
        stream = self.key("groups")
        taken: list[TakenGroup] = []
        last = "0"
        while True:
            got = self._redis.xreadgroup(LEARNER, consumer, {stream: last}, count=256)
            entries = got[0][1] if got else []
            if not entries:
                return taken
            taken += self._decode_entries(entries, stream)
            last = _s(entries[-1][0])

    # -- admission bookkeeping --------------------------------------------------------------------------------

    def inflight(self) -> dict[str, int]:
        """group_id -> release_version of every released group not yet acked."""
        pairs = self._redis.zrange(self.key("inflight"), 0, -1, withscores=True)
        return {_s(gid): int(score) for gid, score in pairs}

    def released_count(self) -> int:
        return int(self._redis.hget(self.key("counters"), "released") or 0)

    # -- version --------------------------------------------------------------------------------------------

    def publish_version(self, version: int, reset: bool = False) -> None:
        """Publish the policy version (and when). Versions only go up, also when a publish sent during a network cut
        reaches Redis after a newer one; `reset` lets a fresh run on a used namespace go back to 0. Sent again: the
        same version is set again."""
        keys = [self.key("version"), self.key("version_time")]
        self._script(lua.PUBLISH_VERSION, keys, [int(version), time.time(), "reset" if reset else ""])

    def version(self) -> int:
        value = self._redis.get(self.key("version"))
        return int(value) if value is not None else 0

    def set_staleness_bound(self, version: int, bound: int) -> None:
        """Record that prompts released from `version` on get staleness bound `bound` (buffer/staleness.py,
        `StalenessSchedule`); kept beside the version so that a restarted learner knows the deadlines of the groups
        still in flight. Sent again: the same field is set again."""
        self._redis.hset(self.key("staleness_bounds"), str(int(version)), int(bound))

    def staleness_bounds(self) -> dict[int, int]:
        """version -> the staleness bound of prompts released from that version on, as recorded so far."""
        raw = self._redis.hgetall(self.key("staleness_bounds"))
        return dict(sorted((int(_s(k)), int(v)) for k, v in raw.items()))
