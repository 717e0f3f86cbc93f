"""Operations of `ReplayBuffer` on Redis's memory: how full it is, when the prompt feeder pauses, and the eviction
policy a run needs.

    buf.memory()                  # RedisMemoryInfo(used=..., maxmemory=..., policy="noeviction")
    buf.release_pause_reason()    # None, or why the feeder releases nothing now (used_memory above the high water)
    buf.wait_for_put_room()       # a producer waits here while Redis is nearly full (back-pressure)

A Redis at `maxmemory` refuses writes (`OOM command not allowed when used memory > 'maxmemory'`). The buffer keeps
away from it in two steps. The prompt feeder releases nothing while `used_memory` is above `buffer.memory_high_water`
(h) of `maxmemory` (buffer/admission.py), so what grows afterwards is the groups already released, which the learner
then trains (a trained group's payload leaves Redis at once, `ReplayBuffer.mark_trained`). A generator's put waits
while `used_memory` is above (1 + h) / 2 of `maxmemory` (0.95 by default): the rest is kept for the learner's own
small writes (the version, its bookkeeping, heartbeats), so the learner can always train what is queued, which frees
memory. A write Redis refuses anyway (a Redis shared with others, a maxmemory lowered under a running run) is
retried after a back-off like a lost connection (buffer/connection.py); Redis refuses it whole.

A Redis whose `maxmemory-policy` evicts keys (anything but `noeviction`) would drop a stream, a lease or a counter
without telling anyone: the buffer refuses to open on it (`EvictingRedis`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis

log = logging.getLogger(__name__)

MIB = 1 << 20
_ROOM_FRESH_S = 1.0  # a reading that found room for puts is trusted this long


def _mib(size: int) -> str:
    """`412 MiB`, or `2.6 MiB` below 10 MiB."""
    mib = size / MIB
    return f"{mib:,.1f} MiB" if mib < 10 else f"{mib:,.0f} MiB"


class EvictingRedis(ValueError):
    """Redis would evict the run's keys under memory pressure (its maxmemory-policy is not noeviction)."""


@dataclass(frozen=True)
class RedisMemoryInfo:
    """Redis's INFO memory: `used` bytes, `maxmemory` bytes (0: no limit), the eviction `policy` ("" if unknown)."""

    used: int
    maxmemory: int
    policy: str

    @property
    def fraction(self) -> float | None:
        """used / maxmemory, or None without a limit."""
        return self.used / self.maxmemory if self.maxmemory else None


class RedisMemory:
    """Mixed into `ReplayBuffer` (buffer/redis_buffer.py), whose `_redis`, `url`, `reconnects`, `reconnect_s` and
    `memory_high_water` it uses."""

    _room_seen = float("-inf")  # when a put last found room in Redis

    def memory(self) -> RedisMemoryInfo | None:
        """Redis's memory now; None when the server does not let this user run INFO (an ACL without it)."""
        try:
            info = self._redis.info("memory")
        except redis.exceptions.NoPermissionError:
            return None
        return RedisMemoryInfo(
            used=int(info.get("used_memory", 0)),
            maxmemory=int(info.get("maxmemory", 0)),
            policy=str(info.get("maxmemory_policy", "")),
        )

    def release_pause_reason(self, memory: RedisMemoryInfo | None = None) -> str | None:
        """Why prompts must not be released now (Redis's used_memory above `memory_high_water` of its maxmemory), or
        None. `memory` is a reading already made (else one is made)."""
        memory = memory if memory is not None else self.memory()
        if memory is None or not memory.fraction or memory.fraction < self.memory_high_water:
            return None
        return (
            f"Redis memory {_mib(memory.used)} of maxmemory {_mib(memory.maxmemory)} "
            f"({memory.fraction:.0%}) is above buffer.memory_high_water ({self.memory_high_water:.0%}): no prompt is "
            f"released until the learner has trained what is queued (raise maxmemory, see docs/reliability.md)"
        )

    def put_pause_reason(self, memory: RedisMemoryInfo | None = None) -> str | None:
        """Why a producer must wait before putting a group (used_memory above (1 + memory_high_water) / 2 of
        maxmemory), or None."""
        memory = memory if memory is not None else self.memory()
        limit = (1 + self.memory_high_water) / 2
        if memory is None or not memory.fraction or memory.fraction < limit:
            return None
        return (
            f"Redis memory {_mib(memory.used)} of maxmemory {_mib(memory.maxmemory)} "
            f"({memory.fraction:.0%}) is above {limit:.0%} (halfway from buffer.memory_high_water to full): the put "
            f"waits until the learner has trained what is queued"
        )

    def wait_for_put_room(self) -> None:
        """Back-pressure for a producer: wait while `put_pause_reason` gives a reason, for at most `reconnect_s`,
        then raise `redis.exceptions.OutOfMemoryError` with it (the caller tries again, as after a lost
        connection). Redis is asked at most once a second while there is room (a second of puts fits in the
        reserve above the put limit)."""
        if time.monotonic() - self._room_seen < _ROOM_FRESH_S:
            return
        deadline = time.monotonic() + self.reconnect_s
        delay, said = 0.05, 0.0
        while (reason := self.put_pause_reason()) is not None:
            self.reconnects.oom += 1
            if time.monotonic() + delay > deadline:
                raise redis.exceptions.OutOfMemoryError(reason)
            if time.monotonic() - said >= 10.0:
                said = time.monotonic()
                log.warning("%s", reason)
            time.sleep(delay)
            delay = min(2 * delay, 2.0)
        self._room_seen = time.monotonic()

    def check_eviction_policy(self) -> None:
        """Raise `EvictingRedis` when Redis may evict keys (maxmemory-policy other than noeviction)."""
        from buffer.connection import mask_url

        memory = self.memory()
        if memory is None:
            log.warning(
                "cannot read INFO memory from Redis at %s (no permission): the buffer cannot check the eviction "
                "policy or pause releases before Redis is full",
                mask_url(self.url),
            )
            return
        if memory.policy not in ("", "noeviction"):
            raise EvictingRedis(
                f"Redis at {mask_url(self.url)} runs with maxmemory-policy {memory.policy}: under memory pressure it "
                "would evict the run's streams, leases and counters and lose groups without a word. Set "
                "`maxmemory-policy noeviction` (redis.conf, or CONFIG SET maxmemory-policy noeviction) or give sr1 a "
                "Redis of its own; sr1 then slows down before Redis is full instead (buffer.memory_high_water)"
            )
