"""A Redis client that rides out a Redis restart: every command and pipeline is retried for `reconnect_s`.

    client, reconnects = connect("redis://127.0.0.1:6379/0", reconnect_s=60)
    reconnects.count          # connection failures so far (after one, a reader may have lost a reply)

Used by the buffer and by the weight-sync rendezvous, the two parts that talk to Redis.

redis-py's own `Retry` covers a failed command on a live connection, but not the reconnect a pooled connection
makes before its next command, so the retry loop lives here, around a whole command or a whole pipeline.

Every write of theirs is safe to repeat after a failure: releases and puts are guarded by id sets, acks by XACK,
version, rendezvous and heartbeats overwrite. A read whose reply was lost can leave stream entries delivered to the
reader that it never saw: the learner's batch assembler takes its pending entries back after a reconnect, and a
generator's lost claims come back to everyone when their lease expires.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.client

log = logging.getLogger(__name__)

RETRIED = (redis.ConnectionError, redis.TimeoutError)
_FIRST_BACKOFF_S = 0.05
_BACKOFF_CAP_S = 2.0

T = TypeVar("T")


class ReconnectCounter:
    """Counts connection failures (shared by a client and the pipelines it makes)."""

    def __init__(self) -> None:
        self.count = 0


def _reconnecting(attempt: Callable[[], T], reconnect_s: float, counter: ReconnectCounter) -> T:
    deadline = time.monotonic() + reconnect_s
    backoff = _FIRST_BACKOFF_S
    while True:
        try:
            return attempt()
        except RETRIED as e:
            counter.count += 1
            if time.monotonic() + backoff > deadline:
                raise
            if counter.count == 1 or backoff >= _BACKOFF_CAP_S:
                log.warning(
                    "redis unreachable (%s); retrying for up to %.0fs", e, deadline - time.monotonic()
                )
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

    def execute_command(self, *args: Any, **options: Any) -> Any:
        return _reconnecting(
            lambda: redis.Redis.execute_command(self, *args, **options), self.reconnect_s, self.counter
        )

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> redis.client.Pipeline:
        pipe = _ReconnectingPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.reconnect_s, pipe.counter = self.reconnect_s, self.counter
        return pipe


def mask_url(url: str) -> str:
    """`url` with its password replaced by `***` (`redis://sr1:***@host:6379/0`): what may be printed or logged."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit(parts._replace(netloc=netloc))


def connect(url: str, reconnect_s: float = 60.0) -> tuple[redis.Redis, ReconnectCounter]:
    """A client for `url` that retries a failed command for about `reconnect_s` seconds, and its failure count.

    `url` is any redis-py URL: `redis://host:port/db`, with a password (`redis://:pw@host...`, or an ACL user
    `redis://user:pw@host...`), or `rediss://` for TLS (`?ssl_ca_certs=/path/ca.pem` names the CA)."""
    client = _ReconnectingRedis.from_url(url)
    client.reconnect_s, client.counter = reconnect_s, ReconnectCounter()
    return client, client.counter
