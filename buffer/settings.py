"""The `buffer` config section: where the Redis replay buffer lives and how leases and heartbeats behave."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# characters a namespace may not hold: it is the ACL key pattern `<namespace>:*` of a run's Redis user, where these
# are glob syntax (a `*` would open other runs' keys) or would split the ACL file's line
_NOT_IN_NAMESPACE = set("*?[]\\") | {" ", "\t", "\n", "\r"}


def local_redis_dir(run_dir: Path | str) -> Path:
    """Where a run's own redis-server keeps its AOF and, while it runs, its URL (`url`)."""
    return Path(run_dir) / "redis"


class BufferConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    redis_url: str | None = Field(
        None,
        description="Redis URL (redis://host:port/db). None: start a local redis-server on a free loopback port with "
        "AOF persistence in the run directory, a password made for the run and an ACL user allowed sr1's commands on "
        "the namespace's keys only, and stop it on exit.",
    )
    namespace: str = Field(
        "sr1",
        min_length=1,
        description="Key prefix of this run in Redis (`<namespace>:prompts`, ...); the run's own Redis lets its user "
        "touch these keys only. No spaces or glob characters (* ? [ ] \\).",
    )
    lease_s: float = Field(
        120.0,
        gt=0,
        description="A claimed prompt not finished within this many seconds is reclaimed by another generator.",
    )
    learner_lease_s: float = Field(
        600.0,
        gt=0,
        description="A taken group not acked within this many seconds is re-delivered to a learner.",
    )
    max_prompt_deliveries: int = Field(
        5,
        ge=1,
        description="A prompt whose lease expired this many times (it crashes or hangs generators) is moved to the "
        "dead-letter stream instead of being re-run again, so the learner does not wait for it forever.",
    )
    heartbeat_ttl_s: float = Field(
        15.0, gt=0, description="A worker is considered dead after this long without a heartbeat."
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Serve Prometheus `/metrics` with the buffer gauges on this port, from the launcher (`sr1 run`, "
        "`sr1 launch`) while the run lives; 0: a free port (the launcher prints which). None: no endpoint.",
    )
    metrics_host: str = Field(
        "127.0.0.1",
        min_length=1,
        description="The address the `/metrics` endpoint (buffer.metrics_port) binds: loopback by default, so only "
        "this machine can scrape it; `0.0.0.0` (every interface) or one interface's address for a Prometheus on "
        "another machine (the gauges carry no secret, but anyone who reaches the port can read them).",
    )
    max_payload_mb: float = Field(
        64.0, gt=0, description="Reject (and count) group payloads larger than this."
    )
    reconnect_s: float = Field(
        60.0,
        ge=0,
        description="How long a buffer operation keeps retrying while Redis is unreachable (a restart, a network "
        "cut) or refuses writes for want of memory, before it fails; the processes ride out a Redis restart this long "
        "(a generator or a learner waiting for work keeps waiting after that, and says so; the learner also makes the "
        "writes a step needs again until Redis answers, its other ranks held).",
    )
    socket_timeout_s: float = Field(
        10.0,
        gt=0,
        description="The longest a Redis reply may take before the call fails and is retried (a network that drops "
        "packets, a hung Redis): no call waits forever. Blocking reads block at most half of it.",
    )
    memory_high_water: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Stop releasing prompts while Redis's used_memory is above this fraction of its maxmemory (INFO "
        "memory); the groups already released still finish and must fit in the rest (docs/reliability.md says how "
        "to size maxmemory). No effect when Redis has no maxmemory.",
    )
    local_maxmemory_mb: int = Field(
        0,
        ge=0,
        description="maxmemory of the run's own redis-server (no redis_url), in MiB; 0: no limit. It always runs "
        "with maxmemory-policy noeviction (a Redis that evicts keys would drop the run's streams: refused).",
    )
    local_appendfsync: Literal["always", "everysec"] = Field(
        "always",
        description="fsync policy of the run's own redis-server (no redis_url): 'always' loses no acknowledged write "
        "when Redis is killed; 'everysec' may lose the last second (an ack, a put) and with it exactly-once training.",
    )

    @field_validator("namespace")
    @classmethod
    def _namespace_is_a_plain_prefix(cls, value: str) -> str:
        bad = sorted(set(value) & _NOT_IN_NAMESPACE)
        if bad:
            raise ValueError(
                f"namespace {value!r} holds {', '.join(map(repr, bad))}: a namespace may hold no spaces or glob "
                "characters (* ? [ ] \\), because the run's Redis user may touch the keys `<namespace>:*` only"
            )
        return value
