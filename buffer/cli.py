"""`sr1 buffer`: look at a run's replay buffer in Redis.

    sr1 buffer watch [--url URL | --run-dir DIR] [--namespace NS] [--interval S] [--metrics-port P [--metrics-host H]]
    sr1 buffer stats [--url URL | --run-dir DIR] [--namespace NS] [--json] [--metrics-port P [--metrics-host H]]

`watch` is a live terminal view (queue depth, in-flight groups, prompts pending and leased, produced/consumed
rates, the staleness histogram, learner version, Redis memory used and its maxmemory, live workers and their
metrics), with a line for every worker that joins, stops or leaves (no heartbeat for `buffer.heartbeat_ttl_s`); without a terminal (or with `--lines`) it prints
only those lines and a one-line summary every 10 s, so a log or a pipe shows workers come and go. `stats` prints one snapshot
(`--json`: one JSON object of stats + workers, for scripts). `--metrics-port` also serves Prometheus `/metrics`
with the same gauges (with `stats`, it keeps serving until Ctrl-C), on 127.0.0.1 unless `--metrics-host` says
otherwise. The URL is `--url`, else the local Redis of
`--run-dir`, else `$SR1_BUFFER__REDIS_URL`, else redis://127.0.0.1:6379/0. The namespace is `--namespace`, else the
`--run-dir` run's (a run's own Redis lets its user read that one only), else `$SR1_BUFFER__NAMESPACE`, else sr1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import yaml

from buffer.connection import mask_url
from buffer.monitor import LOOPBACK, render, serve_metrics
from buffer.redis_buffer import ReplayBuffer
from buffer.settings import local_redis_dir

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sr1 buffer", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url", help="Redis URL of the run (redis://[user:password@]host:port/db, or rediss:// for TLS)"
    )
    common.add_argument("--run-dir", help="a run directory whose local Redis to use (when no --url)")
    common.add_argument(
        "--namespace",
        help="run namespace (key prefix; default: the --run-dir run's, else $SR1_BUFFER__NAMESPACE, else sr1)",
    )
    common.add_argument("--metrics-port", type=int, help="also serve Prometheus /metrics on this port")
    common.add_argument(
        "--metrics-host",
        default=LOOPBACK,
        help=f"the address /metrics binds (default {LOOPBACK}: this machine only; 0.0.0.0: every interface)",
    )
    watch = sub.add_parser("watch", parents=[common], help="live terminal view of the buffer")
    watch.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    watch.add_argument("--once", action="store_true", help="draw one frame and exit")
    watch.add_argument(
        "--lines", action="store_true", help="plain lines, not a live table (the default in a pipe)"
    )
    stats = sub.add_parser("stats", parents=[common], help="print one snapshot")
    stats.add_argument("--json", action="store_true", help="one JSON object (stats and workers)")
    return parser


def _resolve_url(args: argparse.Namespace) -> str:
    if args.url:
        return args.url
    if args.run_dir:
        url_file = local_redis_dir(args.run_dir) / "url"
        if not url_file.is_file():
            raise SystemExit(f"sr1 buffer: no running local Redis found for run directory {args.run_dir!r}")
        return url_file.read_text().strip()
    return os.environ.get("SR1_BUFFER__REDIS_URL") or DEFAULT_URL


def _resolve_namespace(args: argparse.Namespace) -> str:
    """`--namespace`, else the namespace of the `--run-dir` run (its config.yaml: the run's Redis user may read no
    other), else `$SR1_BUFFER__NAMESPACE`, else sr1."""
    if args.namespace:
        return args.namespace
    config = Path(args.run_dir or "") / "config.yaml"
    if args.run_dir and config.is_file():
        saved = (yaml.safe_load(config.read_text()) or {}).get("buffer") or {}
        if saved.get("namespace"):
            return str(saved["namespace"])
    return os.environ.get("SR1_BUFFER__NAMESPACE", "sr1")


def worker_states(workers: list[dict]) -> dict[str, tuple[str, str]]:
    """worker id -> (role, state) from the heartbeats (`rollout/state` of a generator; "running" otherwise)."""
    return {
        w.get("worker_id", "?"): (
            w.get("role", "?"),
            str(w.get("metrics", {}).get("rollout/state", "running")),
        )
        for w in workers
    }


def worker_events(before: dict[str, tuple[str, str]], now: dict[str, tuple[str, str]]) -> list[str]:
    """What changed between two looks at the workers: who joined, changed state (draining, stopped) or left."""
    events = []
    for worker_id, (role, state) in now.items():
        if worker_id not in before:
            events.append(f"+ {worker_id} ({role}) joined, {state}")
        elif before[worker_id][1] != state:
            events.append(f"~ {worker_id} ({role}) {state}")
    for worker_id, (role, state) in before.items():
        if worker_id not in now:
            events.append(f"- {worker_id} ({role}) left (last seen {state}; no heartbeat within the TTL)")
    return events


def _summary(stats: dict) -> str:
    keys = (
        "buffer/version",
        "buffer/generating_groups",
        "buffer/queued_groups",
        "buffer/pending_prompts",
        "buffer/produced",
        "buffer/consumed",
    )
    from buffer.monitor import memory_text

    line = "  ".join(f"{k.removeprefix('buffer/')}={stats.get(k)}" for k in keys)
    return f"{line}  redis_memory={memory_text(stats) or '-'}"


def watch_lines(buffer, interval_s: float, summary_every_s: float = 10.0) -> None:
    """`watch` without a terminal: a line per worker event, and a summary line every `summary_every_s`."""
    known: dict[str, tuple[str, str]] = {}
    last_summary = 0.0
    while True:
        workers = buffer.workers()
        stamp = time.strftime("%H:%M:%S")
        now = worker_states(workers)
        for event in worker_events(known, now):
            print(f"{stamp} {event}", flush=True)
        known = now
        if time.monotonic() - last_summary >= summary_every_s:
            last_summary = time.monotonic()
            print(f"{stamp} {_summary(buffer.stats())}  workers={','.join(sorted(now)) or '-'}", flush=True)
        time.sleep(interval_s)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.namespace = _resolve_namespace(args)
    import redis

    try:
        return _show(args, _resolve_url(args))
    except (
        redis.exceptions.NoPermissionError
    ) as err:  # a run's own Redis: its user may read its namespace only
        print(
            f"sr1 buffer: the Redis user may not read namespace {args.namespace!r} ({err}); "
            "give the run's --namespace, or --run-dir",
            file=sys.stderr,
        )
        return 2


def _show(args: argparse.Namespace, url: str) -> int:
    import redis

    try:
        # a one-off query answers at once when Redis is down; `watch` rides out a restart like the pools do
        buffer = ReplayBuffer(url, args.namespace, reconnect_s=2.0 if args.command == "stats" else 60.0)
    except redis.ConnectionError as err:
        print(f"sr1 buffer: cannot reach Redis at {mask_url(url)}: {err}", file=sys.stderr)
        return 2
    served = (
        None if args.metrics_port is None else serve_metrics(buffer, args.metrics_port, args.metrics_host)
    )

    if args.command == "stats":
        stats, workers = buffer.stats(), buffer.workers()
        if args.json:
            print(
                json.dumps(
                    {"url": mask_url(url), "namespace": args.namespace, "stats": stats, "workers": workers}
                )
            )
        else:
            from rich.console import Console

            Console().print(render(stats, workers, title=f"sr1 buffer {args.namespace} @ {mask_url(url)}"))
        if served is not None:
            print(f"serving /metrics on {served.host}:{served.port} (Ctrl-C to stop)", file=sys.stderr)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        return 0

    from rich.console import Console
    from rich.live import Live

    title = f"sr1 buffer {args.namespace} @ {mask_url(url)}"
    console = Console()
    if args.once:
        console.print(render(buffer.stats(), buffer.workers(), title=title))
        return 0
    try:
        if args.lines or not console.is_terminal:
            watch_lines(buffer, args.interval)
        workers = buffer.workers()
        known = worker_states(workers)
        with Live(render(buffer.stats(), workers, title=title), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(args.interval)
                workers = buffer.workers()
                now = worker_states(workers)
                for event in worker_events(known, now):  # printed above the table, so they stay on screen
                    live.console.print(f"{time.strftime('%H:%M:%S')} {event}")
                known = now
                live.update(render(buffer.stats(), workers, title=title), refresh=True)
    except KeyboardInterrupt:
        pass
    except redis.ConnectionError as err:
        print(f"sr1 buffer: lost Redis at {mask_url(url)}: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
