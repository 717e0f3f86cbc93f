"""What `sr1 buffer watch` draws and what `--metrics-port` serves, both from `ReplayBuffer.stats()` and
`ReplayBuffer.workers()`.

    render(stats, workers)            a rich renderable: queue table, staleness bars, live workers
    serve_metrics(buffer, port)       Prometheus /metrics with the same gauges, read from Redis at each scrape
    serve_configured_metrics(buffer, cfg.buffer)   the same on buffer.metrics_host:buffer.metrics_port, if set

The endpoint binds 127.0.0.1 unless told otherwise (`buffer.metrics_host`, `--metrics-host`): the gauges hold no
secret, but a port open on every interface lets anyone on the network read a run's progress and load its Redis
with a scrape each.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from buffer.redis_buffer import ReplayBuffer
from buffer.settings import BufferConfig
from buffer.stats import STALENESS_HIST

LOOPBACK = "127.0.0.1"

# (stats key, label, help) for the queue table and the Prometheus gauges, in display order
GAUGES: list[tuple[str, str, str]] = [
    ("buffer/version", "learner version", "policy version last published by the learner"),
    (
        "buffer/generating_groups",
        "generating",
        "released groups not finished yet (waiting for or in a generator)",
    ),
    ("buffer/queued_groups", "queued", "finished groups not trained yet"),
    (
        "buffer/trained_unacked",
        "trained, awaiting ack",
        "trained groups waiting for the checkpoint that acks them",
    ),
    ("buffer/depth", "depth", "finished groups waiting for the learner (not taken)"),
    ("buffer/taken_unacked", "taken, unacked", "groups the learner took and has not acked yet"),
    ("buffer/inflight_groups", "in flight", "groups released and not yet acked (admission window)"),
    ("buffer/pending_prompts", "pending prompts", "released prompts no generator has claimed yet"),
    ("buffer/leased_prompts", "leased prompts", "prompts a generator is working on"),
    ("buffer/produced_per_s", "produced / s", "groups put per second (30 s window)"),
    ("buffer/consumed_per_s", "consumed / s", "groups acked per second (30 s window)"),
    ("buffer/released", "released", "prompts released in total"),
    ("buffer/produced", "produced", "groups put in total"),
    ("buffer/consumed", "consumed", "groups acked in total"),
    ("buffer/duplicates", "duplicates", "groups put twice (counted, not delivered)"),
    ("buffer/malformed", "malformed", "malformed payloads moved to the dead-letter stream"),
    ("buffer/oversized", "oversized", "groups over max_payload_bytes"),
    ("buffer/poison_prompts", "poison prompts", "prompts dead-lettered after max_prompt_deliveries leases"),
    (
        "buffer/failed_prompts",
        "failed prompts",
        "prompts dead-lettered after max_prompt_deliveries failed tries",
    ),
    ("buffer/untrainable", "untrainable", "groups the learner dead-lettered (over its token budget)"),
    ("buffer/abandoned_groups", "replaced", "dead-lettered groups replaced by a new release"),
    ("buffer/dead_letters", "dead letters", "entries in the dead-letter stream"),
    (
        "buffer/staleness_bound",
        "staleness bound",
        "staleness bound of prompts released at the current version (learner.max_staleness, or what auto set)",
    ),
    ("buffer/staleness_mean", "staleness mean", "mean per-token staleness of every trained token"),
    ("buffer/staleness_max", "staleness max", "max per-token staleness of every trained token"),
    ("buffer/redis_used_mb", "redis memory (MiB)", "Redis used_memory, MiB"),
    ("buffer/redis_maxmemory_mb", "redis maxmemory (MiB)", "Redis maxmemory, MiB (0: no limit)"),
    (
        "buffer/memory_paused",
        "releases paused (memory)",
        "1 while the prompt feeder releases nothing because Redis memory is above buffer.memory_high_water",
    ),
]


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)  # a heartbeat's text fields (a worker's state, the learner's status)


def memory_text(stats: dict[str, Any]) -> str | None:
    """Redis's memory as a line: `412 / 1,024 MiB (40%)`, `412 MiB (no maxmemory)`, with `releases paused` when the
    feeder pauses for it; None when it cannot be read."""
    used, maxmemory = stats.get("buffer/redis_used_mb"), stats.get("buffer/redis_maxmemory_mb")
    if used is None:
        return None
    if not maxmemory:
        return f"{used:,.0f} MiB (no maxmemory)"
    paused = ", releases paused" if stats.get("buffer/memory_paused") else ""
    return f"{used:,.0f} / {maxmemory:,.0f} MiB ({used / maxmemory:.0%}{paused})"


def staleness_histogram(stats: dict[str, Any]) -> dict[int, int]:
    return {int(k[len(STALENESS_HIST) :]): v for k, v in stats.items() if k.startswith(STALENESS_HIST)}


def render(stats: dict[str, Any], workers: list[dict], *, title: str = "sr1 buffer"):
    """A rich renderable of one snapshot."""
    from rich.console import Group as RichGroup
    from rich.table import Table

    queue = Table(title=title, show_header=False, box=None, pad_edge=False)
    queue.add_column(style="bold cyan")
    queue.add_column(justify="right")
    for key, label, _ in GAUGES:
        queue.add_row(label, _fmt(stats.get(key)))

    hist = staleness_histogram(stats)
    bars = Table(title="per-token staleness of consumed tokens", show_header=True, box=None)
    bars.add_column("staleness", justify="right")
    bars.add_column("tokens", justify="right")
    bars.add_column("share")
    total = sum(hist.values()) or 1
    for value, count in hist.items():
        share = count / total
        bars.add_row(str(value), _fmt(count), "█" * max(1, round(share * 40)) + f" {share:.1%}")
    if not hist:
        bars.add_row("-", "0", "no step reported yet")

    live = Table(title=f"live workers ({len(workers)})", show_header=True, box=None)
    for column in ("worker", "role", "heartbeat age", "metrics"):
        live.add_column(column)
    for w in sorted(workers, key=lambda w: (w.get("role", ""), w.get("worker_id", ""))):
        metrics = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(w.get("metrics", {}).items()))
        live.add_row(w.get("worker_id", "?"), w.get("role", "?"), f"{w.get('age_s', 0.0):.1f}s", metrics)
    return RichGroup(queue, bars, live)


def _metric_name(key: str) -> str:
    return "sr1_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


class BufferCollector:
    """A Prometheus collector that reads the buffer's stats from Redis at each scrape."""

    def __init__(self, buffer: ReplayBuffer):
        self.buffer = buffer

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        stats = self.buffer.stats()
        for key, _, help_text in GAUGES:
            value = stats.get(key)
            if value is not None:
                yield GaugeMetricFamily(_metric_name(key), help_text, value=float(value))
        hist = GaugeMetricFamily(
            "sr1_staleness_tokens", "consumed tokens by per-token staleness", labels=["staleness"]
        )
        for value, count in staleness_histogram(stats).items():
            hist.add_metric([str(value)], float(count))
        yield hist
        workers = self.buffer.workers()
        live = GaugeMetricFamily("sr1_buffer_workers", "live workers by role", labels=["role"])
        for role in sorted({w.get("role", "?") for w in workers}):
            live.add_metric([role], float(sum(1 for w in workers if w.get("role") == role)))
        yield live
        age = GaugeMetricFamily(
            "sr1_worker_heartbeat_age_seconds",
            "seconds since a worker's heartbeat",
            labels=["worker", "role"],
        )
        for w in workers:
            age.add_metric([w.get("worker_id", "?"), w.get("role", "?")], float(w.get("age_s", 0.0)))
        yield age
        yield from _tool_gauges([w for w in workers if w.get("role") == "generator"])
        yield from _learner_gauges([w for w in workers if w.get("role") == "learner"])


# (heartbeat key, Prometheus name, help) per generator worker: its tool (retriever) health
TOOL_GAUGES = [
    ("rollout/tool_errors_total", "sr1_worker_tool_errors", "tool calls that failed"),
    ("rollout/tool_error_rate", "sr1_worker_tool_error_rate", "share of recent tool calls that failed"),
    ("rollout/tool_latency_s", "sr1_worker_tool_latency_seconds", "mean seconds per recent tool call"),
]


def _tool_gauges(generators: list[dict]):
    from prometheus_client.core import GaugeMetricFamily

    for key, name, help_text in TOOL_GAUGES:
        gauge = GaugeMetricFamily(name, help_text, labels=["worker"])
        for w in generators:
            gauge.add_metric([w.get("worker_id", "?")], float(w.get("metrics", {}).get(key, 0.0)))
        yield gauge
    paused = GaugeMetricFamily(
        "sr1_worker_paused", "1 while sampling is paused for tool errors", labels=["worker"]
    )
    for w in generators:
        paused.add_metric(
            [w.get("worker_id", "?")], float(w.get("metrics", {}).get("rollout/state") == "paused")
        )
    yield paused


# (learner heartbeat key, Prometheus name, help): the off-policy diagnostics of the learner's last step
# (learner/loop.py puts them in its heartbeat; docs/metrics.md has the thresholds)
LEARNER_GAUGES = [
    (
        "loss/offpolicy_kl",
        "sr1_learner_offpolicy_kl",
        "k3 KL(behaviour || the step's starting policy) of the last step's loss tokens",
    ),
    (
        "loss/mismatch_kl",
        "sr1_learner_mismatch_kl",
        "k3 KL(behaviour || learner) of the last step's loss tokens",
    ),
    (
        "loss/is_ess",
        "sr1_learner_is_ess",
        "effective sample size of the last step's importance weights, in [0, 1]",
    ),
    (
        "loss/clipped_frac",
        "sr1_learner_clipped_frac",
        "share of the last step's loss tokens whose ratio was clipped",
    ),
    (
        "loss/masked_frac",
        "sr1_learner_masked_frac",
        "share of the last step's loss tokens the correction masked",
    ),
    ("staleness/bound", "sr1_learner_staleness_bound", "staleness bound in force for the last step"),
    ("staleness/mean", "sr1_learner_staleness_mean", "mean staleness of the last step's loss tokens"),
]


def _learner_gauges(learners: list[dict]):
    from prometheus_client.core import GaugeMetricFamily

    for key, name, help_text in LEARNER_GAUGES:
        gauge = GaugeMetricFamily(name, help_text, labels=["worker"])
        for w in learners:
            value = w.get("metrics", {}).get(key)
            if isinstance(value, (int, float)):
                gauge.add_metric([w.get("worker_id", "?")], float(value))
        yield gauge


@dataclass
class MetricsServer:
    """A `/metrics` endpoint serving in a daemon thread: where it listens (`host`, `port`: the port bound, also when
    0 asked for a free one) and its registry."""

    host: str
    port: int
    registry: Any
    server: Any

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_metrics(buffer: ReplayBuffer, port: int, addr: str = LOOPBACK) -> MetricsServer:
    """Serve `/metrics` on `addr:port` (loopback unless told otherwise; port 0: a free one) in a daemon thread."""
    from prometheus_client import CollectorRegistry, start_http_server

    if not 0 <= port <= 65535:
        raise ValueError(f"metrics port {port} is not a TCP port (0..65535; 0 picks a free one)")
    registry = CollectorRegistry()
    registry.register(BufferCollector(buffer))
    server, _ = start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(addr, server.server_address[1], registry, server)


def serve_configured_metrics(buffer: ReplayBuffer, cfg: BufferConfig) -> MetricsServer | None:
    """The run's endpoint as its config asks (`buffer.metrics_port` on `buffer.metrics_host`); None when no port is
    set. An address that cannot be bound (taken, not this machine's) is an OSError naming both settings."""
    if cfg.metrics_port is None:
        return None
    try:
        return serve_metrics(buffer, cfg.metrics_port, cfg.metrics_host)
    except OSError as err:
        raise OSError(
            f"cannot serve /metrics on buffer.metrics_host={cfg.metrics_host!r} "
            f"buffer.metrics_port={cfg.metrics_port}: {err}"
        ) from err
