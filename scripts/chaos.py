"""Crash anything, lose nothing: SIGKILL parts of a real `sr1 run` and check what survived.

    python scripts/chaos.py                        # one run per part, each killed once mid-run (the default table)
    python scripts/chaos.py --sequence             # one run, every part killed in turn (what the CI test does)
    python scripts/chaos.py --parts learner,redis --steps 60 --checkpoint-every 20 --seed 3

Parts: generator, learner, redis, retrieval, parent (`sr1 run` itself, as when a terminal dies; the run is then
resumed with `sr1 run --resume DIR`). Each kill lands at a random step (`--seed` picks them).

Checked at the end of every run, from the files and the Redis AOF the run leaves behind:
- completed: the run reached its last step and exited 0;
- lost: released prompts neither trained in the surviving history nor still pending (must be 0);
- trained twice: groups trained twice in the surviving history (must be 0);
- versions: published versions never went back, and the surviving history's versions strictly increase;
- bound: the largest staleness of any loss token, against `learner.max_staleness`;
- orphans: processes of the run still alive after it ended (must be none).
The time to recover is printed per kill: until a new process of the killed part runs, and until the learner publishes
the next version.

    python scripts/chaos.py --checkpoint-faults            # a torn checkpoint, then a full disk (chaos_checkpoints.py)
    python scripts/chaos.py --faults                       # the faults that kill nothing, in one synchronous run
    python scripts/chaos.py --faults poison-prompt,retriever-down --retriever-down-s 60

Faults (`--faults`, one synchronous run, `learner.max_staleness=0`, where one lost group would stop training):
poison-prompt (a prompt every generator fails on: retried, dead-lettered with its error, replaced), malformed-group
(a released group's payload replaced by garbage: dead-lettered, replaced), malformed-eval (an evaluation request that
is not JSON and one with a bad field: counted, answered with an error), retriever-down (the retrieval server frozen
with SIGSTOP for `--retriever-down-s`: tool errors counted, sampling paused, resumed after). Checked as above, with
dead-lettered prompts accounted for (not lost), and each event counted where the run reports it (report.json,
metrics.jsonl, Redis).

    python scripts/chaos.py --network                      # network cuts (5, 20, 60 s) and a full Redis, in one run
    python scripts/chaos.py --network cut-learner-redis,redis-maxmemory --cut-s 60

Network faults (`--network`, scripts/chaos_network.py): the generator or the learner cut from Redis, the generator cut
from the retrieval server (through fault proxies, once for each duration of `--cut-s`; `--cut-mode blackhole` keeps the
connections open and answers nothing, `drop` resets them), and Redis's maxmemory lowered under the run (`--memory-s`
at its high water, then as long full). Checked as above, and each fault must be seen where the run reports it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PARTS = ("generator", "learner", "redis", "retrieval", "parent")
FAULTS = ("poison-prompt", "malformed-group", "malformed-eval", "retriever-down")
# the module each part runs (sr1/entrypoints/), found in its command line
_MODULE_OF = {
    "generator": "sr1.entrypoints.generators",
    "learner": "sr1.entrypoints.learner",
    "retrieval": "sr1.entrypoints.retrieval",
}


@dataclass
class Recovery:
    part: str
    at_version: int
    new_process_s: float
    next_version_s: float


@dataclass
class Verdict:
    completed: bool
    steps: int
    lost: int
    trained_twice: int
    versions_increase: bool
    max_staleness_seen: int
    max_staleness: int
    orphans: list[str] = field(default_factory=list)
    dead_lettered: int = (
        0  # released prompts that left for good with a reason (not lost: counted and replaced)
    )

    @property
    def ok(self) -> bool:
        return (
            self.completed
            and not self.lost
            and not self.trained_twice
            and self.versions_increase
            and self.max_staleness_seen <= self.max_staleness
            and not self.orphans
        )


class ChaosRun:
    """One `sr1 run` of the tiny preset in `run_dir`, with the means to kill its parts and to watch it."""

    def __init__(self, run_dir: Path, overrides: list[str], env: dict[str, str] | None = None):
        self.run_dir = run_dir
        self.seen: set[int] = set()  # every process of the run ever seen
        self.launches = 0
        self.env = {**os.environ, **(env or {})}
        self.parent = self._launch("tiny", *overrides, "--run-dir", str(run_dir))

    def _launch(self, *args: str) -> subprocess.Popen:
        log = open(self.log_path(self.launches), "w")  # noqa: SIM115
        self.launches += 1
        cmd = [sys.executable, "-m", "sr1", "run", *args, "--no-live"]
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True, env=self.env
        )

    def log_path(self, launch: int) -> Path:
        """The output of the `launch`-th `sr1 run` of this run (0: the first)."""
        return self.run_dir.parent / f"{self.run_dir.name}-sr1-run-{launch}.log"

    def resume(self) -> None:
        """`sr1 run --resume` on the run directory (the previous stack has exited)."""
        self.parent = self._launch("--resume", str(self.run_dir))

    def version(self) -> int | None:
        """The published version, read through the run's own Redis (None while it is down)."""
        try:
            client = redis.Redis.from_url(
                (self.run_dir / "redis" / "url").read_text().strip(),
                socket_timeout=1,
                socket_connect_timeout=1,
            )
            value = client.get("sr1:version")
            client.close()
            return int(value or 0)
        except (OSError, redis.RedisError, ValueError):
            return None

    def processes(self, part: str) -> list[psutil.Process]:
        if part == "redis":  # redis-server sets its own process title: `redis-server 127.0.0.1:<port>`
            needle, scope = (
                (self.run_dir / "redis" / "url").read_text().strip().split("//")[1].split("/")[0],
                "",
            )
        else:
            needle, scope = _MODULE_OF.get(part, ""), str(self.run_dir)
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            argv = proc.info["cmdline"] or []
            if part == "redis":
                named = any(needle in arg for arg in argv)
            elif needle:
                # a module is matched as a whole argument (`-m sr1.entrypoints.retrieval`), never as a part of
                # another one (an override or a path on sr1 run's own command line)
                named = needle in argv
            else:  # "parent": every process naming the run directory
                named = True
            if named and scope in " ".join(argv):
                found.append(proc)
        return found

    def _watch(self) -> None:
        try:
            root = psutil.Process(self.parent.pid)
            self.seen |= {root.pid} | {c.pid for c in root.children(recursive=True)}
        except psutil.NoSuchProcess:
            pass

    def wait(self, predicate, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._watch()
            if predicate():
                return
            if self.parent.poll() is not None:
                raise RuntimeError(f"sr1 run exited with {self.parent.returncode} while waiting for {what}")
            time.sleep(0.25)
        raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")

    def kill(self, part: str, at_step: int) -> Recovery:
        """SIGKILL `part` once the run has published `at_step`; return how long the run took to recover."""
        self.wait(lambda: (self.version() or 0) >= at_step, 900, f"version {at_step}")
        at = self.version()
        started = time.monotonic()
        if part == "parent":
            self.kill_parent()
            self.resume()
        else:
            (victim,) = self.processes(part)
            victim.send_signal(signal.SIGKILL)
            self.wait(
                lambda: [p.pid for p in self.processes(part)] not in ([], [victim.pid]),
                120,
                f"a new {part} process",
            )
        new_process_s = time.monotonic() - started
        self.wait(lambda: (self.version() or 0) > at, 900, f"training to go on after the {part} died")
        return Recovery(part, at, new_process_s, time.monotonic() - started)

    def kill_parent(self) -> None:
        """SIGKILL `sr1 run` (a dead terminal) and wait until every process of its stack is gone."""
        self.parent.send_signal(signal.SIGKILL)
        self.parent.wait(10)
        old = self.seen - {self.parent.pid}  # every child dies with it, and with them the run lock
        deadline = time.monotonic() + 30
        while alive(old) and time.monotonic() < deadline:
            time.sleep(0.25)

    def finish(self, timeout_s: float = 900) -> int:
        deadline = time.monotonic() + timeout_s
        while self.parent.poll() is None and time.monotonic() < deadline:
            self._watch()
            time.sleep(0.25)
        if self.parent.poll() is None:
            raise TimeoutError(f"the run did not finish within {timeout_s:.0f}s")
        return self.parent.returncode

    def kill_everything_left(self) -> None:
        for proc in self.processes("parent"):  # every process naming the run directory
            proc.kill()


def alive(pids: set[int]) -> list[int]:
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.NoSuchProcess:
            pass
    return found


def surviving_steps(run_dir: Path) -> list[dict]:
    """learner_groups.jsonl without the steps a later learner process threw away (it resumed from older weights)."""
    kept: list[dict] = []
    for line in (run_dir / "learner_groups.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "start" in record:
            kept = [s for s in kept if s["version"] <= record["weights"]]
        else:
            kept.append(record)
    return kept


def verify(chaos: ChaosRun, returncode: int, steps: int, max_staleness: int, published: list[int]) -> Verdict:
    from buffer.group_ids import RELEASED_RECORD, released_group_ids
    from sr1.launch.redis_server import LocalRedis

    time.sleep(1.0)
    orphans = [" ".join(psutil.Process(p).cmdline())[:120] for p in alive(chaos.seen)]
    run_dir = chaos.run_dir
    history = surviving_steps(run_dir)
    versions = [s["version"] for s in history]
    trained = [gid for s in history for gid in s["group_ids"]]
    with LocalRedis(run_dir / "redis") as server:  # the run stopped its Redis: read the AOF it left
        client = redis.Redis.from_url(server.url)
        released = released_group_ids(client, "sr1", run_dir / RELEASED_RECORD)  # Redis forgets old ones
        pending = {g.decode() for g in client.zrange("sr1:inflight", 0, -1)}
        histogram = {int(k): int(v) for k, v in client.hgetall("sr1:staleness").items()}
        dead = {fields.get(b"gid", b"").decode() for _, fields in client.xrange("sr1:dead")} & released
        client.close()
    return Verdict(
        completed=returncode == 0 and bool(versions) and versions[-1] == steps,
        steps=versions[-1] if versions else 0,
        lost=len(released - set(trained) - pending - dead) + len(set(trained) - released),
        dead_lettered=len(dead),
        trained_twice=len(trained) - len(set(trained)) + len(set(trained) & pending),
        versions_increase=versions == sorted(set(versions)) and published == sorted(published),
        max_staleness_seen=max(histogram, default=0),
        max_staleness=max_staleness,
        orphans=orphans,
    )


def run_overrides(steps: int, checkpoint_every: int, max_staleness: int) -> list[str]:
    """The tiny preset as the chaos runs use it: short evaluations at the start and end only, 30 s leases."""
    return [
        f"learner.total_steps={steps}",
        f"learner.checkpoint_every={checkpoint_every}",
        f"learner.max_staleness={max_staleness}",
        "eval.max_prompts=8",
        "eval.every_steps=0",
        "buffer.lease_s=30",
    ]


def run_chaos(
    run_dir: Path,
    parts: list[str],
    *,
    steps: int,
    checkpoint_every: int,
    max_staleness: int,
    seed: int,
    first_step: int = 2,
    spacing: int = 3,
) -> tuple[list[Recovery], Verdict]:
    """One run with `parts` killed in turn, one every `spacing` steps or so (each at a random one of two steps)."""
    rng = random.Random(seed)
    kill_steps = [first_step + spacing * i + rng.randint(0, 1) for i in range(len(parts))]
    if kill_steps and kill_steps[-1] >= steps:
        raise ValueError(
            f"{len(parts)} kills need more than {steps} steps (the last lands at {kill_steps[-1]})"
        )
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    chaos = ChaosRun(run_dir, run_overrides(steps, checkpoint_every, max_staleness))
    recoveries, published = [], []
    try:
        for part, step in zip(parts, kill_steps, strict=True):
            recovery = chaos.kill(part, step)
            published.append(recovery.at_version)
            recoveries.append(recovery)
        returncode = chaos.finish()
    finally:
        chaos.kill_everything_left()
    return recoveries, verify(chaos, returncode, steps, max_staleness, published)


class FaultInjector:
    """Faults that kill nothing, injected into a run through its own Redis and processes (`ChaosRun`)."""

    def __init__(self, chaos: ChaosRun, retriever_down_s: float):
        self.chaos = chaos
        self.retriever_down_s = retriever_down_s
        self.injected = 0

    def _buffer(self):
        from buffer.redis_buffer import ReplayBuffer

        return ReplayBuffer((self.chaos.run_dir / "redis" / "url").read_text().strip(), "sr1")

    def inject(self, fault: str) -> None:
        getattr(self, fault.replace("-", "_"))()
        self.injected += 1

    def poison_prompt(self) -> None:
        """Release a prompt whose text is empty: nothing can be sampled from it, so every try fails."""
        from buffer.records import PromptRecord, make_group_id

        buf = self._buffer()
        index = self.injected
        buf.release_prompts(
            [
                PromptRecord(
                    group_id=make_group_id("chaos", "train", index),
                    question="",
                    prompt=[{"role": "user", "content": ""}],
                    ground_truth=["nothing"],
                    data_source="chaos",
                    index=index,
                    release_version=buf.version(),
                )
            ]
        )
        buf.close()

    def malformed_group(self) -> None:
        """A released group whose payload arrives as garbage (as from a broken generator): released and put in one
        transaction, the way the feeder and a generator would, so no generator is involved."""
        from buffer.group_ids import NO_POSITION
        from buffer.records import make_group_id

        buf = self._buffer()
        group_id = make_group_id("chaos", "malformed", self.injected)
        pipe = buf._redis.pipeline(transaction=True)
        version = buf.version()
        pipe.zadd("sr1:released_ids", {group_id: NO_POSITION})
        pipe.zadd("sr1:inflight", {group_id: version})
        pipe.hincrby("sr1:counters", "released", 1)
        pipe.zadd("sr1:put_ids", {group_id: version})
        pipe.xadd("sr1:groups", {"gid": group_id, "d": b"\x00 chaos: not a group"})
        pipe.execute()
        buf.close()

    def malformed_eval(self) -> None:
        """One evaluation request that is not JSON, one whose shard field is not a pair."""
        buf = self._buffer()
        client = buf._redis
        client.set("sr1:eval:shards:chaos-eval", 1)
        client.rpush("sr1:eval:requests", b"{chaos: not json")
        bad = {"id": "chaos-eval#0", "eval_id": "chaos-eval", "shard": "first", "step": 0, "version": 0}
        client.rpush("sr1:eval:requests", json.dumps(bad))
        buf.close()

    def retriever_down(self) -> None:
        """Freeze the retrieval server and its worker processes (SIGSTOP) for `retriever_down_s`, then let them go
        on (SIGCONT): connections are accepted and never answered, as from a hung host."""
        (server,) = self.chaos.processes("retrieval")
        frozen = [server, *server.children(recursive=True)]
        for proc in frozen:
            proc.send_signal(signal.SIGSTOP)
        up_at = time.monotonic() + self.retriever_down_s
        try:
            self.chaos.wait(
                lambda: time.monotonic() >= up_at, self.retriever_down_s + 5, "the retriever's outage"
            )
        finally:
            for proc in frozen:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.send_signal(signal.SIGCONT)


@dataclass
class FaultCounts:
    """Each fault's events as the run reports them."""

    failed_prompts: int
    malformed_groups: int
    replaced: int
    malformed_eval_requests: int
    eval_error_answers: int
    generator_tool_errors: int
    tool_pauses: int

    def missing(self, faults: list[str]) -> list[str]:
        """The faults injected whose events the run did not count."""
        expected = {
            "poison-prompt": self.failed_prompts >= 1,
            "malformed-group": self.malformed_groups >= 1,
            "malformed-eval": self.malformed_eval_requests >= 1 and self.eval_error_answers >= 1,
            "retriever-down": self.generator_tool_errors >= 1,
        }
        replaced = sum(f in faults for f in ("poison-prompt", "malformed-group"))
        missing = [f for f in faults if not expected[f]]
        return missing + ([f"replaced ({self.replaced} < {replaced})"] if self.replaced < replaced else [])


def count_faults(run_dir: Path) -> FaultCounts:
    """Read the events back from the run's report (report.json) and, for evaluation requests, its Redis AOF."""
    from sr1.launch.redis_server import LocalRedis

    report = json.loads((run_dir / "report.json").read_text())
    buffer = report["extra"]["buffer"]
    with LocalRedis(run_dir / "redis") as server:
        client = redis.Redis.from_url(server.url)
        malformed_eval = int(client.get("sr1:eval:malformed") or 0)
        answer = client.get("sr1:eval:result:chaos-eval#0")
        client.close()
    return FaultCounts(
        failed_prompts=buffer.get("buffer/failed_prompts", 0) + buffer.get("buffer/poison_prompts", 0),
        malformed_groups=buffer.get("buffer/malformed", 0),
        replaced=buffer.get("buffer/abandoned_groups", 0),
        malformed_eval_requests=malformed_eval,
        eval_error_answers=int(answer is not None and "error" in json.loads(answer)),
        generator_tool_errors=report["generator_tool_errors"],
        tool_pauses=report["generator_tool_pauses"],
    )


def run_faults(
    run_dir: Path,
    faults: list[str],
    *,
    steps: int,
    seed: int,
    retriever_down_s: float,
    first_step: int = 2,
    spacing: int = 2,
) -> tuple[Verdict, FaultCounts]:
    """One synchronous run (max_staleness 0) with `faults` injected in turn, one every `spacing` steps or so."""
    at_steps = fault_steps(len(faults), steps, seed, first_step, spacing)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    overrides = [
        f"learner.total_steps={steps}",
        "learner.max_staleness=0",
        "eval.max_prompts=8",
        "eval.every_steps=0",
        "buffer.lease_s=30",
        "buffer.max_prompt_deliveries=2",
        *FAST_TOOL_FAILURES,
    ]
    chaos = ChaosRun(run_dir, overrides)
    returncode = inject_in_turn(chaos, faults, at_steps, FaultInjector(chaos, retriever_down_s).inject)
    return verify(chaos, returncode, steps, 0, []), count_faults(run_dir)


# a frozen or cut retriever fails calls in a second (not after four 10 s attempts); sampling pauses after 4 failures
FAST_TOOL_FAILURES = (
    "retrieval.client.timeout_s=1",
    "retrieval.client.max_retries=0",
    "generators.tool_pause.min_calls=4",
    "generators.tool_pause.probe_s=2",
)


def fault_steps(count: int, steps: int, seed: int, first_step: int, spacing: int) -> list[int]:
    """The versions at which `count` faults are injected: one every `spacing` steps from `first_step`, each one
    step later or not (`seed` picks)."""
    rng = random.Random(seed)
    at_steps = [first_step + spacing * i + rng.randint(0, 1) for i in range(count)]
    if at_steps and at_steps[-1] >= steps:
        raise ValueError(f"{count} faults need more than {steps} steps (the last lands at {at_steps[-1]})")
    return at_steps


def inject_in_turn(chaos: ChaosRun, faults: list[str], at_steps: list[int], inject) -> int:
    """Inject each fault once the run published its version, wait for the run to end; its exit status. Whatever
    is left of the run is killed in any case."""
    try:
        for fault, step in zip(faults, at_steps, strict=True):
            chaos.wait(lambda s=step: (chaos.version() or 0) >= s, 900, f"version {step}")
            print(f"injecting {fault} at version {chaos.version()}", flush=True)
            inject(fault)
        return chaos.finish()
    finally:
        chaos.kill_everything_left()


def print_verdict(verdict: Verdict, counts, faults: list[str]) -> int:
    """Print a fault run's verdict and what it reported; 0 when it passed and every fault was seen."""
    print(verdict)
    print(counts)
    missing = counts.missing(faults)
    if missing:
        print(f"not seen where the run reports it: {', '.join(missing)}")
    return 0 if verdict.ok and not missing else 1


def table(rows: list[tuple[Recovery, Verdict]]) -> str:
    lines = [
        "| killed | at version | new process after (s) | next version after (s) | completed | lost | "
        "trained twice | versions only go up | max staleness (bound) | orphans |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for recovery, verdict in rows:
        lines.append(
            f"| {recovery.part} | {recovery.at_version} | {recovery.new_process_s:.1f} | "
            f"{recovery.next_version_s:.1f} | {'yes' if verdict.completed else 'NO'} | {verdict.lost} | "
            f"{verdict.trained_twice} | {'yes' if verdict.versions_increase else 'NO'} | "
            f"{verdict.max_staleness_seen} ({verdict.max_staleness}) | {len(verdict.orphans)} |"
        )
    return "\n".join(lines)


def _network_main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from scripts.chaos_network import NETWORK_FAULTS, injections, run_network_faults

    faults = [f.strip() for f in args.network.split(",") if f.strip()]
    if unknown := sorted(set(faults) - set(NETWORK_FAULTS)):
        parser.error(f"unknown network fault(s) {unknown}; choose from {', '.join(NETWORK_FAULTS)}")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated parts to kill")
    parser.add_argument("--sequence", action="store_true", help="one run, the parts killed in turn")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="steps of the run (default 30; with --network 4 per injection plus 20: a full Redis or a long cut can "
        "take several versions to recover from, and every injection needs steps after it)",
    )
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--max-staleness", type=int, default=2)
    from scripts.chaos_checkpoints import add_arguments as add_checkpoint_fault_arguments
    from scripts.chaos_checkpoints import main as checkpoint_faults_main

    add_checkpoint_fault_arguments(parser)
    parser.add_argument("--seed", type=int, default=7, help="picks the kill steps")
    parser.add_argument("--out", type=Path, default=Path("runs/chaos"), help="where the runs go")
    parser.add_argument(
        "--faults",
        nargs="?",
        const=",".join(FAULTS),
        default=None,
        help=f"inject these faults (comma-separated; default all: {', '.join(FAULTS)}) in one "
        "synchronous run instead of killing parts",
    )
    parser.add_argument("--retriever-down-s", type=float, default=60.0, help="how long retriever-down lasts")
    from scripts.chaos_network import NETWORK_FAULTS

    parser.add_argument(
        "--network",
        nargs="?",
        const=",".join(NETWORK_FAULTS),
        default=None,
        help=f"inject network and memory faults (comma-separated; default all: {', '.join(NETWORK_FAULTS)}) in one run",
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
    args = parser.parse_args(argv)
    if args.network is not None:  # its own default for --steps
        return _network_main(args, parser)
    args.steps = args.steps or 30
    if args.faults is not None:
        faults = [f.strip() for f in args.faults.split(",") if f.strip()]
        if unknown := sorted(set(faults) - set(FAULTS)):
            parser.error(f"unknown fault(s) {unknown}; choose from {', '.join(FAULTS)}")
        run_dir = args.out / f"faults-{time.strftime('%Y%m%d-%H%M%S')}"
        verdict, counts = run_faults(
            run_dir, faults, steps=args.steps, seed=args.seed, retriever_down_s=args.retriever_down_s
        )
        return print_verdict(verdict, counts, faults)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {unknown}; choose from {', '.join(PARTS)}")
    if args.checkpoint_faults is not None:
        return checkpoint_faults_main(args)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    common = dict(steps=args.steps, checkpoint_every=args.checkpoint_every, max_staleness=args.max_staleness)
    rows = []
    if args.sequence:
        recoveries, verdict = run_chaos(args.out / f"sequence-{stamp}", parts, seed=args.seed, **common)
        rows = [(r, verdict) for r in recoveries]
    else:
        middle = args.steps // 2  # each part dies mid-run, between two checkpoints when the interval allows
        for part in parts:
            print(f"killing the {part} (run {len(rows) + 1}/{len(parts)})", flush=True)
            recoveries, verdict = run_chaos(
                args.out / f"{part}-{stamp}", [part], seed=args.seed, first_step=middle - 1, **common
            )
            rows.append((recoveries[0], verdict))
    print(table(rows))
    return 0 if all(v.ok for _, v in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
