"""What `scripts/chaos/soak.py` samples from a run and how it judges growth: each process of the run's tree (RSS, open file
descriptors, threads), Redis (`used_memory`, DBSIZE), and the verdict over the samples after the warm-up (the
rule is in scripts/chaos/soak.py's docstring and docs/measurements/memory-over-hours.md).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import psutil
import redis

from sr1 import entrypoints

PROCESS_METRICS = ("rss_mib", "fds", "threads")
REDIS_METRICS = ("used_memory_mib", "keys")
REDIS_SERIES = "redis-db"  # Redis's own figures (INFO, DBSIZE); the redis-server process is `redis[<pid>]`
FLOOR = {"rss_mib": 0.0, "fds": 2.0, "threads": 2.0, "used_memory_mib": 0.0, "keys": 2.0}
UNITS = {
    "rss_mib": "RSS (MiB)",
    "fds": "open file descriptors",
    "threads": "threads",
    "used_memory_mib": "Redis used_memory (MiB)",
    "keys": "Redis keys (DBSIZE)",
}
# what a process of the run is, from its command line (checked in order); descendants of an engine or of the
# retrieval server that match nothing are named after them
_KINDS = (
    ("redis-server", "redis"),
    (entrypoints.RETRIEVAL, "retrieval"),
    (entrypoints.GENERATORS, "generator"),
    (entrypoints.LEARNER, "learner"),
    ("VLLM::EngineCore", "engine-core"),
    ("VLLM::Worker", "engine-worker"),
)


# -- the verdict (pure: tests feed it synthetic series) ------------------------------------------------------


@dataclass
class Growth:
    series: str  # "<process label> <metric>" or "redis-db <metric>"
    metric: str
    first: float  # the fitted line at the first sample after warm-up
    last: float  # the fitted line at the last sample
    growth: float  # (last - first) / first
    failed: bool

    def describe(self) -> str:
        what = "grew" if self.failed else "held"
        return (
            f"{self.series}: {what} {self.growth:+.1%} ({self.first:.4g} -> {self.last:.4g}, a robust line through "
            f"the samples after warm-up)"
        )


def theil_sen(points: list[tuple[float, float]]) -> tuple[float, float]:
    """The Theil-Sen line through (t, v) points: the median of the slopes between every two points, and the median
    intercept for that slope. Almost a third of the points (29 %) can be anything (bursts, a process sampled mid-step or between
    steps) without moving it; a series that keeps what it takes still tilts it."""
    slopes = [
        (v2 - v1) / (t2 - t1) for i, (t1, v1) in enumerate(points) for t2, v2 in points[i + 1 :] if t2 > t1
    ]
    slope = statistics.median(slopes) if slopes else 0.0
    return slope, statistics.median(v - slope * t for t, v in points)


def growth(
    series: str,
    metric: str,
    points: list[tuple[float, float]],
    *,
    warmup_s: float,
    window_s: float,
    bound: float,
) -> Growth | None:
    """The growth of one series of (seconds since launch, value) points over the samples after the warm-up, from a
    Theil-Sen line through them; None when they span less than `window_s` (a process that was not there for the
    measured span: `verdict` names it)."""
    after = [(t, v) for t, v in points if t >= warmup_s]
    if len(after) < 3 or after[-1][0] - after[0][0] < window_s:
        return None
    slope, intercept = theil_sen(after)
    a, b = intercept + slope * after[0][0], intercept + slope * after[-1][0]
    rel = (b - a) / a if a > 0 else (0.0 if b <= a else float("inf"))
    failed = rel > bound and b - a > FLOOR.get(metric, 0.0)
    return Growth(series, metric, a, b, rel, failed)


def latest_labels(samples: list[dict]) -> dict[int, str]:
    """pid -> the label a process had last. A process is followed by its pid, named by its latest label: vLLM's
    workers set their process title after they start (`engine-core-child:python[7]` becomes `engine-worker[7]`)."""
    return {proc["pid"]: label for sample in samples for label, proc in sample["processes"].items()}


def verdict(
    samples: list[dict], *, warmup_s: float, window_s: float, bound: float
) -> tuple[list[Growth], list[str]]:
    """Every series' growth, and the problems: series that grew, processes that ended or started in the measured
    span (a process restarted by the supervisor shows as both)."""
    series: dict[tuple[str, str], list[tuple[float, float]]] = {}
    latest = latest_labels(samples)
    for sample in samples:
        for proc in sample["processes"].values():
            for metric in PROCESS_METRICS:
                series.setdefault((latest[proc["pid"]], metric), []).append((sample["t"], proc[metric]))
        for metric in REDIS_METRICS:
            if sample.get("redis"):
                series.setdefault((REDIS_SERIES, metric), []).append((sample["t"], sample["redis"][metric]))
    measured = [s for s in samples if s["t"] >= warmup_s]
    problems, results = [], []
    if len(measured) < 2:
        return [], [f"no samples after the warm-up of {warmup_s:.0f} s: run longer"]
    first_t, last_t = measured[0]["t"], measured[-1]["t"]
    for (label, metric), points in sorted(series.items()):
        result = growth(
            f"{label} {metric}", metric, points, warmup_s=warmup_s, window_s=window_s, bound=bound
        )
        if result is not None:
            results.append(result)
            if result.failed:
                problems.append(result.describe() + f"; bound {bound:.0%}")
    for label in sorted({label for label, _ in series if label != REDIS_SERIES}):
        times = [t for t, _ in series[(label, PROCESS_METRICS[0])]]
        if min(times) > first_t:
            problems.append(f"{label} started after the warm-up (a restart?) at {min(times):.0f} s")
        if first_t <= max(times) < last_t:
            problems.append(f"{label} exited during the soak (last seen at {max(times):.0f} s)")
    if not results:
        problems.append("no series spans the measured time: run longer or shorten --window")
    return results, problems


# -- sampling --------------------------------------------------------------------------------------------------


def kind_of(proc: psutil.Process, root_pid: int, kinds_by_pid: dict[int, str]) -> str:
    """What a process of the run is: the launcher, one of `_KINDS`, or `<parent kind>-child:<name>`."""
    if proc.pid == root_pid:
        return "sr1-run"
    cmdline = " ".join(proc.cmdline()) or proc.name()
    for needle, kind in _KINDS:
        if needle in cmdline:
            return kind
    parent = kinds_by_pid.get(proc.ppid(), "other")
    return f"{parent.split('-child')[0]}-child:{proc.name()}"


def sample_processes(root_pid: int, seen: dict[tuple[int, float], str]) -> dict[str, dict]:
    """RSS, fds and threads of `sr1 run` and its descendants, keyed `<kind>[<pid>]`; `seen` ((pid, start time) ->
    label) keeps every process ever sampled (for the orphan check; the start time tells a reused pid apart)."""
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    kinds: dict[int, str] = {}
    found = {}
    for proc in procs:  # parents come before their children
        try:
            with proc.oneshot():
                kind = kind_of(proc, root_pid, kinds)
                kinds[proc.pid] = kind
                label = f"{kind}[{proc.pid}]"
                found[label] = {
                    "kind": kind,
                    "pid": proc.pid,
                    "rss_mib": proc.memory_info().rss / 2**20,
                    "fds": proc.num_fds(),
                    "threads": proc.num_threads(),
                }
                seen.setdefault((proc.pid, proc.create_time()), label)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
    return found


def redis_client(run_dir: Path) -> redis.Redis | None:
    # the owner's admin user where the run has one: the run's own user may not run DBSIZE, SCAN or MEMORY USAGE
    url_file = next((f for f in (run_dir / "redis" / n for n in ("admin_url", "url")) if f.is_file()), None)
    if url_file is None:
        return None
    url = url_file.read_text().strip()
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2) if url else None


def sample_redis(client: redis.Redis | None) -> dict | None:
    if client is None:
        return None
    try:
        memory = client.info("memory")
        return {
            "used_memory_mib": memory["used_memory"] / 2**20,
            "keys": client.dbsize(),
            "version": int(client.get("sr1:version") or 0),
        }
    except (redis.RedisError, OSError):
        return None  # down or restarting: the next sample tries again


def redis_keys(client: redis.Redis | None) -> list[dict]:
    """Every key at the end: its type, length (members, entries or bytes) and memory, largest first."""
    if client is None:
        return []
    lengths = {
        "stream": "xlen",
        "set": "scard",
        "zset": "zcard",
        "hash": "hlen",
        "list": "llen",
        "string": "strlen",
    }
    rows = []
    try:
        for key in client.scan_iter(count=500):
            kind = client.type(key).decode()
            length = getattr(client, lengths[kind])(key) if kind in lengths else None
            rows.append(
                {"key": key.decode(), "type": kind, "length": length, "bytes": client.memory_usage(key)}
            )
    except (redis.RedisError, OSError):
        pass
    return sorted(rows, key=lambda r: -(r["bytes"] or 0))
