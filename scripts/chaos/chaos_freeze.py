"""Hang anything, restart nothing: freeze parts of a real `sr1 run` (SIGSTOP, then SIGCONT) and check what survived.

    python scripts/chaos/chaos.py --freeze                               # every part, 5 s, then past the lease, then past
                                                                   # the learner's collective timeout (three runs)
    python scripts/chaos/chaos.py --freeze retrieval,generator --freeze-for timeout
    python scripts/chaos/chaos.py --freeze all --freeze-for 5 --steps 20     # one run, every part frozen 5 s in turn

A hang is the fault that ends long runs quietly: a GC pause, a stuck NFS read, an index reloading, a frozen VM. Each
part is stopped whole (its process and every child) and let go after the chosen time, as a hung host would be:
- generator: the generator worker (its asyncio loop: no new requests, no leases renewed), not its engine;
- engine: the vLLM engine core process(es) under the generator, not the worker;
- learner: learner rank 1 of a two-rank learner (rank 0 then waits inside a collective);
- redis, retrieval: the server and its workers.
Durations: a number of seconds, or `lease` (past the prompt lease: the frozen generator's prompts are reclaimed and
re-run while its own copies may still finish) or `timeout` (past the learner's collective timeout: only a frozen
learner rank may restart the learner). Every run uses two learner ranks and short leases and timeouts (below) so
the long freezes fit in minutes.

Checked as for the kills (`chaos.py`): complete, 0 lost, 0 trained twice, versions only go up, the staleness bound
held, no orphans; and no learner restart unless the frozen part was the learner itself.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from scripts.chaos.base import ChaosRun, Verdict, chosen, freeze, injection_steps, run_overrides, verify

FREEZE_PARTS = ("generator", "engine", "redis", "retrieval", "learner")
LEASE_S = 20  # buffer.lease_s of a freeze run: `lease` freezes last past it
COLLECTIVE_TIMEOUT_S = 20  # learner.collective_timeout_s of a freeze run: `timeout` freezes last past it
# how far past the lease or the timeout a long freeze lasts: the learner first trains on the groups already queued
# (up to max_staleness steps ahead), so the freeze must outlast those steps too before anyone waits past the timeout
MARGIN_S = 30
FREEZE_OVERRIDES = (
    "learner.num_ranks=2",
    f"buffer.lease_s={LEASE_S}",
    f"learner.collective_timeout_s={COLLECTIVE_TIMEOUT_S}",
    # rank 0's bounded waits inside a collective end 5 s before it (the config refuses longer ones: config/schema.py)
    "weight_sync.timeout_s=15",
    "buffer.reconnect_s=10",
    "buffer.socket_timeout_s=5",
    # a frozen retriever fails calls in a second and sampling pauses after a few failures (as chaos_faults.py)
    "retrieval.client.timeout_s=1",
    "retrieval.client.max_retries=0",
    "generators.tool_pause.min_calls=4",
    "generators.tool_pause.probe_s=2",
)


def freeze_seconds(name: str) -> float:
    """`5`, `lease` or `timeout` as seconds."""
    named = {"lease": LEASE_S + MARGIN_S, "timeout": COLLECTIVE_TIMEOUT_S + MARGIN_S}
    if name in named:
        return float(named[name])
    try:
        seconds = float(name)
    except ValueError:
        raise ValueError(f"a freeze lasts a number of seconds, `lease` or `timeout`; got {name!r}") from None
    if not 0 < seconds < 3600:
        raise ValueError(f"a freeze lasts more than 0 and less than 3600 seconds; got {seconds:g}")
    return seconds


def frozen_processes(chaos: ChaosRun, part: str) -> list[psutil.Process]:
    """The processes a freeze of `part` stops (see the module docstring)."""
    if part == "engine":
        (worker,) = chaos.processes("generator")
        return worker.children(recursive=True)
    if part == "learner":
        ranks = chaos.processes("learner")
        followers = [p for p in ranks if p.environ().get("RANK") not in (None, "0")]
        if not followers:
            raise RuntimeError(
                "freezing a learner rank needs a learner of two ranks or more (learner.num_ranks)"
            )
        return [followers[0], *followers[0].children(recursive=True)]
    if part == "generator":
        return chaos.processes("generator")
    (server,) = chaos.processes(part)
    return [server, *server.children(recursive=True)]


def learner_restarts_so_far(chaos: ChaosRun) -> int:
    """How many times the run's supervisor has restarted the learner so far (its "restarted learner-0 (pid N)"
    lines; a learner life that dies before it reaches Redis counts too, which learner_groups.jsonl would miss)."""
    count = 0
    for launch in range(chaos.launches):
        with contextlib.suppress(OSError):
            count += len(RESTARTED.findall(chaos.log_path(launch).read_text(errors="replace")))
    return count


RESTARTED = re.compile(r"^restarted learner-0 \(pid \d+\)$", re.MULTILINE)


@dataclass
class FreezeVerdict:
    freezes: list[tuple[str, float]]  # (part, seconds), in the order they were frozen
    verdict: Verdict
    # learner restarts from the start of each freeze to the start of the next (the last: to the end of the run)
    restarts: list[int]

    @property
    def learner_restarts(self) -> int:
        return sum(self.restarts)

    @property
    def ok(self) -> bool:
        """The audit's verdict, and no learner restart while any part but a learner rank was frozen."""
        return self.verdict.ok and all(
            n == 0 for (part, _), n in zip(self.freezes, self.restarts, strict=True) if part != "learner"
        )


def run_freezes(
    run_dir: Path,
    freezes: list[tuple[str, float]],
    *,
    steps: int,
    seed: int,
    max_staleness: int = 2,
    preset: str = "tiny",
) -> FreezeVerdict:
    """One run of two learner ranks with each (part, seconds) of `freezes` in turn, one every 3 steps or so."""
    at_steps = injection_steps(len(freezes), steps, seed, first_step=2, spacing=3)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    # a checkpoint every 3 steps, as the kills' CI run; the freeze run's own settings come last and win
    chaos = ChaosRun(run_dir, [*run_overrides(steps, 3, max_staleness), *FREEZE_OVERRIDES], preset=preset)
    counts = []  # restarts so far at the start of each freeze, then at the end
    try:
        for (part, seconds), step in zip(freezes, at_steps, strict=True):
            chaos.wait(lambda s=step: (chaos.version() or 0) >= s, 900, f"version {step}")
            counts.append(learner_restarts_so_far(chaos))
            print(f"freezing the {part} for {seconds:g} s at version {chaos.version()}", flush=True)
            freeze(frozen_processes(chaos, part), seconds, chaos)
        returncode = chaos.finish()
    finally:
        chaos.kill_everything_left()
    counts.append(learner_restarts_so_far(chaos))
    verdict = verify(chaos, returncode, steps, max_staleness, [])
    return FreezeVerdict(freezes, verdict, [b - a for a, b in zip(counts, counts[1:], strict=False)])


def table(rows: list[FreezeVerdict]) -> str:
    lines = [
        "| frozen in turn (s) | completed | lost | trained twice | versions only go up | max staleness (bound) | "
        "orphans | learner restarts |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        v = row.verdict
        frozen = ", ".join(f"{part} {seconds:g}" for part, seconds in row.freezes)
        lines.append(
            f"| {frozen} | {'yes' if v.completed else 'NO'} | {v.lost} | {v.trained_twice} | "
            f"{'yes' if v.versions_increase else 'NO'} | {v.max_staleness_seen} ({v.max_staleness}) | "
            f"{len(v.orphans)} | {_restarts(row)} |"
        )
    return "\n".join(lines)


def _restarts(row: FreezeVerdict) -> str:
    """The learner restarts and the freezes they came during: `0`, or `3 (redis 2, learner 1)`."""
    during = [f"{part} {n}" for (part, _), n in zip(row.freezes, row.restarts, strict=True) if n]
    return f"{row.learner_restarts} ({', '.join(during)})" if during else "0"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`chaos.py`'s options for the freezes."""
    parser.add_argument(
        "--freeze",
        nargs="?",
        const="all",
        default=None,
        help=f"freeze these parts in turn (comma-separated, or all: {', '.join(FREEZE_PARTS)}) instead of killing "
        "parts (scripts/chaos/chaos_freeze.py)",
    )
    parser.add_argument(
        "--freeze-for",
        default="5,lease,timeout",
        help="how long each freeze lasts: seconds, `lease` or `timeout`; one run per value (default 5,lease,timeout)",
    )


def chaos_main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`chaos.py --freeze`: one run per duration, every chosen part frozen in turn; the table; the exit status."""
    parts = list(FREEZE_PARTS) if args.freeze == "all" else chosen(args.freeze, FREEZE_PARTS, "part", parser)
    try:
        durations = [freeze_seconds(d.strip()) for d in args.freeze_for.split(",") if d.strip()]
    except ValueError as error:
        parser.error(f"--freeze-for: {error}")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    steps = args.steps or 3 * len(parts) + 6
    rows = []
    for seconds in durations:
        print(
            f"freezing {', '.join(parts)} for {seconds:g} s each (run {len(rows) + 1}/{len(durations)})",
            flush=True,
        )
        freezes = [(part, seconds) for part in parts]
        out = args.out / f"freeze-{seconds:g}s-{stamp}"
        rows.append(run_freezes(out, freezes, steps=steps, seed=args.seed, preset=args.preset))
    print(table(rows))
    return 0 if all(row.ok for row in rows) else 1
