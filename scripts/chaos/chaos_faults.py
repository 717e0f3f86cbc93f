"""Faults that kill nothing, for `scripts/chaos/chaos.py --faults`: one synchronous run in which everything goes wrong.

    python scripts/chaos/chaos.py --faults                       # every fault below, in one run
    python scripts/chaos/chaos.py --faults poison-prompt,retriever-down --retriever-down-s 60

One `sr1 run` of the tiny preset with `learner.max_staleness=0`, where one lost group would stop training for good,
and the faults injected in turn, one every two steps or so (`--seed` picks the steps):
- poison-prompt: a prompt every generator fails on: retried, dead-lettered with its error, replaced;
- malformed-group: a released group's payload replaced by garbage: dead-lettered, replaced;
- malformed-eval: an evaluation request that is not JSON and one with a bad field: counted, answered with an error;
- retriever-down: the retrieval server frozen with SIGSTOP for `--retriever-down-s`: tool errors counted, sampling
  paused, resumed after.
Checked by the audit, `verify` in base.py (complete, nothing lost or trained twice, versions only go up, bound held, no
orphans), with dead-lettered prompts accounted for (not lost), and each event counted where the run reports it
(report.json, metrics.jsonl, Redis): `FaultCounts`. `scripts/chaos/chaos_network.py` injects its faults the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.chaos.base import ChaosRun, Verdict, chosen, freeze, injection_steps, verify  # noqa: E402

FAULTS = ("poison-prompt", "malformed-group", "malformed-eval", "retriever-down")


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
        freeze([server, *server.children(recursive=True)], self.retriever_down_s, self.chaos)


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
    at_steps = injection_steps(len(faults), steps, seed, first_step, spacing)
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`chaos.py`'s options for the faults that kill nothing."""
    parser.add_argument(
        "--faults",
        nargs="?",
        const=",".join(FAULTS),
        default=None,
        help=f"inject these faults (comma-separated; default all: {', '.join(FAULTS)}) in one "
        "synchronous run instead of killing parts (scripts/chaos/chaos_faults.py)",
    )
    parser.add_argument("--retriever-down-s", type=float, default=60.0, help="how long retriever-down lasts")


def chaos_main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`chaos.py --faults`: the run, its audit and what it reported; the exit status."""
    faults = chosen(args.faults, FAULTS, "fault", parser)
    verdict, counts = run_faults(
        args.out / f"faults-{time.strftime('%Y%m%d-%H%M%S')}",
        faults,
        steps=args.steps or 30,
        seed=args.seed,
        retriever_down_s=args.retriever_down_s,
    )
    return print_verdict(verdict, counts, faults)
