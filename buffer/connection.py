"""A Redis client that rides out a Redis restart, a network cut and a full Redis: every command and pipeline is
retried for `reconnect_s`.

    client, reconnects = connect("redis://127.0.0.1:6379/0", reconnect_s=60, socket_timeout_s=10)
    reconnects.count          # connection failures so far (after one, a reader may have lost a reply)
    reconnects.oom            # writes Redis refused for want of memory (retried after a back-off)

Used by the buffer and by the weight-sync rendezvous, the two parts that talk to Redis. This module is the one
boundary to Redis's client library: no module outside `buffer/` imports `redis` (`scripts/check_layers.py` checks
it). Others name Redis's failures through it: `RETRIED` (down, unreachable or full, once `reconnect_s` is spent) and
`REDIS_ERROR` (any failure of a Redis call, a refused command included), ask whether a URL answers with
`answers_ping`, and wait out an outage of any length with `until_answered`.

redis-py's own `Retry` covers a failed command on a live connection, but not the reconnect a pooled connection
makes before its next command, so the retry loop lives here, around a whole command or a whole pipeline.

No call waits forever. A network that drops packets, or a Redis that hangs, keeps a connection open and never
answers: every socket has a timeout (`socket_timeout_s`, the longest a reply may take) and TCP keepalive, so such a
connection fails with `redis.TimeoutError` and is retried like a refused one. A blocking read (XREADGROUP or XREAD
with BLOCK) therefore blocks at most `client.max_block_ms`, half the socket timeout; its callers loop.

An `OOM command not allowed when used memory > 'maxmemory'` reply is retried the same way (back-pressure): Redis
refuses such a write before it changes anything, also inside MULTI/EXEC (the transaction is discarded) and inside a
Lua script (a script is refused before its first write; once it has written, Redis lets it finish), so nothing is
half-written and the retry is the first execution. The buffer stops releasing prompts well before that point
(buffer/admission.py).

Every write of the buffer is safe to repeat when it ran but its reply was lost
(docs/measurements/network-and-redis.md, "Lost replies", lists how each one is made so). A read whose reply was lost
can leave stream entries delivered to the reader that it never saw: the learner's batch assembler takes its pending
entries back after a reconnect, and a generator gives back the leases it holds without knowing
(generators/worker.py).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis
import redis.client

from common.secrets import mask_url  # noqa: F401 (the one masking; callers import it from here too)

log = logging.getLogger(__name__)

RETRIED = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.OutOfMemoryError)
REDIS_ERROR = redis.RedisError  # any failure of a Redis call: the retried ones and a refused command alike
_FIRST_BACKOFF_S = 0.05
_BACKOFF_CAP_S = 2.0
# an idle connection whose peer is gone (a partition) fails after about 10 + 3 x 5 s instead of hours
_KEEPALIVE = {
    getattr(socket, name): value
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3))
    if hasattr(socket, name)
}

T = TypeVar("T")


class ReconnectCounter:
    """Counts connection failures (`count`) and writes refused for want of memory (`oom`), shared by a client and
    the pipelines it makes."""

    def __init__(self) -> None:
        self.count = 0
        self.oom = 0


def _reconnecting(attempt: Callable[[], T], reconnect_s: float, counter: ReconnectCounter) -> T:
    deadline = time.monotonic() + reconnect_s
    backoff = _FIRST_BACKOFF_S
    while True:
        try:
            return attempt()
        except RETRIED as e:
            oom = isinstance(e, redis.exceptions.OutOfMemoryError)
            if oom:  # refused before it ran: not a lost reply
                counter.oom += 1
            else:
                counter.count += 1
            if time.monotonic() + backoff > deadline:
                raise
            if backoff == _FIRST_BACKOFF_S or backoff >= _BACKOFF_CAP_S:
                what = (
                    "redis is out of memory (used_memory > maxmemory); the write waits"
                    if oom
                    else f"redis unreachable ({e})"
                )
                log.warning("%s; retrying for up to %.0fs", what, deadline - time.monotonic())
            time.sleep(backoff)
            backoff = min(2 * backoff, _BACKOFF_CAP_S)


class _ReconnectingPipeline(redis.client.Pipeline):
    reconnect_s: float
    counter: ReconnectCounter

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack, scripts = list(self.command_stack), set(self.scripts)  # execute() clears both, even on failure

        def attempt() -> list[Any]:
            self.command_stack, self.scripts = list(stack), set(scripts)
            return redis.client.Pipeline.execute(self, raise_on_error)

        return _reconnecting(attempt, self.reconnect_s, self.counter)


class _ReconnectingRedis(redis.Redis):
    reconnect_s: float
    counter: ReconnectCounter
    max_block_ms: int  # the longest BLOCK a blocking read may ask for (below the socket timeout)

    def execute_command(self, *args: Any, **options: Any) -> Any:
        return _reconnecting(
            lambda: redis.Redis.execute_command(self, *args, **options), self.reconnect_s, self.counter
        )

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> redis.client.Pipeline:
        pipe = _ReconnectingPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.reconnect_s, pipe.counter = self.reconnect_s, self.counter
        return pipe


def connect(
    url: str, reconnect_s: float = 60.0, socket_timeout_s: float = 10.0
) -> tuple[redis.Redis, ReconnectCounter]:
    """A client for `url` that retries a failed command for about `reconnect_s` seconds, and its failure count.

    Each reply is waited for at most `socket_timeout_s` (a connection at most `min(socket_timeout_s, 5)`); a
    blocking read may block `client.max_block_ms`, half of it. `url` is any redis-py URL: `redis://host:port/db`,
    with a password (`redis://:pw@host...`, or an ACL user `redis://user:pw@host...`), or `rediss://` for TLS
    (`?ssl_ca_certs=/path/ca.pem` names the CA); timeouts given in the URL (`?socket_timeout=5`) win."""
    client = _ReconnectingRedis.from_url(
        url,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=min(socket_timeout_s, 5.0),
        socket_keepalive=True,
        socket_keepalive_options=_KEEPALIVE,
    )
    client.reconnect_s, client.counter = reconnect_s, ReconnectCounter()
    client.max_block_ms = max(1, int(socket_timeout_s * 500))
    return client, client.counter


def until_answered(call: Callable[[], T], what: str, give_up: Callable[[], bool], pause_s: float = 1.0) -> T:
    """`call()`, made again each time it fails for Redis being unavailable past `reconnect_s`, until it answers or
    `give_up()` says so (its last error is raised then). For a caller that can wait as long as an outage lasts (the
    learner's rank 0, its other ranks held meanwhile) and a call that is safe to repeat (see "Lost replies" above)."""
    while True:
        try:
            return call()
        except RETRIED as err:
            if give_up():
                raise
            log.warning("%s: Redis still unavailable (%s); trying again until it answers", what, err)
            time.sleep(pause_s)


def answers_ping(url: str, timeout_s: float = 1.0) -> bool:
    """Whether a Redis answers PING at `url` within `timeout_s` (one try, no retries)."""
    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except redis.RedisError:
        return False
