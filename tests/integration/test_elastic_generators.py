"""Elastic generators, with real processes: Redis, the retrieval server, one generator pool (`sr1 generators`) and the
learner (`sr1 learner`) run; a second `sr1 generators` started mid-run joins the next weight-sync epoch, receives
the versions the learner publishes and contributes groups that are trained; then the first pool's worker is
SIGKILLed and the run still completes every step with no prompt lost (its leases are reclaimed by the other worker).
`sr1 buffer watch`, running in a pipe for the whole test, prints the workers as they join and leave.

A new engine takes longer to start here (30-120 s on the shared 2-core machine) than the tiny run takes to finish,
so the learner is paused (SIGSTOP, right after it published a version) while the second engine starts, and goes
on (SIGCONT) once that engine heartbeats: the join itself, the weight sync and the groups all happen in the live
run. Timings are printed (`-s`), never asserted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import redis

from buffer.group_ids import RELEASED_RECORD, released_group_ids
from tests.timing import scaled

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

STEPS = 16
MAX_STALENESS = 1
NAMESPACE = "elastic"


class Stack:
    """The processes of the run, each in its own session (killed as a group at the end), logs in `logs`."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = (self.logs / f"{name}.log").open("w")
        cmd = [sys.executable, "-m", "sr1", *args]
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        return self.procs[name]

    def log(self, name: str, chars: int = 3000) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")[-chars:]

    def stop_all(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Watch:
    """What the test sees of the run through Redis: version, heartbeats, and which worker produced each group (read
    off the groups stream, where a group stays until the checkpoint that acks it)."""

    def __init__(self, url: str):
        self.url = url
        self.client = redis.Redis.from_url(url)
        self.worker_of: dict[str, str] = {}
        self._last_entry = "-"

    def version(self) -> int:
        return int(self.client.get(f"{NAMESPACE}:version") or 0)

    def stats(self) -> dict:
        """`sr1 buffer stats --json` (the command users run, as a separate process)."""
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "sr1",
                "buffer",
                "stats",
                "--json",
                "--url",
                self.url,
                "--namespace",
                NAMESPACE,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return json.loads(out.stdout)

    def workers(self) -> dict[str, dict]:
        """The live workers, by id."""
        return {w["worker_id"]: w for w in self.stats()["workers"]}

    def produced_unacked(self) -> int:
        """Groups in the buffer, taken by the learner or not (until the checkpoint that acks them)."""
        stats = self.stats()["stats"]
        return int(stats["buffer/depth"]) + int(stats["buffer/taken_unacked"])

    def read_groups(self) -> None:
        from buffer.codec import decode_group

        start = "-" if self._last_entry == "-" else f"({self._last_entry}"
        for entry_id, fields in self.client.xrange(f"{NAMESPACE}:groups", start, "+"):
            self._last_entry = entry_id.decode()
            if b"d" in fields:
                group = decode_group(fields[b"d"])
                self.worker_of[group.group_id] = group.worker_id

    def until(self, predicate, timeout_s: float, what: str, stack: Stack) -> float:
        started = time.monotonic()
        while time.monotonic() - started < scaled(timeout_s):
            self.read_groups()
            if predicate():
                return time.monotonic() - started
            for name, proc in stack.procs.items():
                assert proc.poll() is None or name.startswith("gen-first"), (
                    f"{name} exited:\n{stack.log(name)}"
                )
            time.sleep(0.5)
        raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def _process(launcher: subprocess.Popen, module: str) -> psutil.Process:
    """The process of `module` that a pool launcher started."""
    children = psutil.Process(launcher.pid).children(recursive=True)
    return next(p for p in children if module in " ".join(p.cmdline()))


def run_overrides(tmp_path: Path, model_dir: Path, port: int, run_dir: Path, *extra: str) -> list[str]:
    """The small world's overrides for both pools, with the run directory, the namespace and the retrieval URL."""
    from tests.fakes.small_world import small_world_overrides

    return small_world_overrides(tmp_path / "world", model_dir) + [
        f"run_dir={run_dir}",
        f"buffer.namespace={NAMESPACE}",
        f"retrieval.client.url=http://127.0.0.1:{port}/retrieve",
        *extra,
    ]


def serve_retrieval(stack: Stack, watch: Watch, overrides: list[str], port: int) -> None:
    """`sr1 retrieval serve` (BM25) over the small world's corpus, once it answers."""
    from config import load_config
    from sr1.launch.supervisor import http_ok

    corpus = str(load_config("tiny", overrides).retrieval.retriever.corpus_path)
    stack.start(
        "retrieval", "retrieval", "serve", "--method", "bm25", "--corpus", corpus, "--port", str(port)
    )
    watch.until(lambda: http_ok(f"http://127.0.0.1:{port}/health"), 300, "the retrieval server", stack)


def trained_steps(run_dir: Path) -> list[dict]:
    return [
        r
        for r in map(json.loads, (run_dir / "learner_groups.jsonl").read_text().splitlines())
        if "version" in r
    ]


def test_generators_join_and_leave_a_live_run(tiny_model_dir, tmp_path, free_port):
    from sr1.launch.redis_server import LocalRedis

    run_dir, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    overrides = run_overrides(
        tmp_path,
        tiny_model_dir,
        free_port,
        run_dir,
        f"learner.total_steps={STEPS}",
        f"learner.checkpoint_every={STEPS}",
        f"learner.max_staleness={MAX_STALENESS}",
        "learner.num_engines=1",  # the first group waits for one engine; later ones take whoever is alive
        "buffer.lease_s=10",
        "buffer.heartbeat_ttl_s=8",
        "weight_sync.timeout_s=30",
    )
    stack = Stack(logs)
    server = LocalRedis(tmp_path / "redis").start()
    url = server.url
    watch = Watch(url)
    pool = ["--config", "tiny", "--redis-url", url, "--num-engines", "1"]
    try:
        serve_retrieval(stack, watch, overrides, free_port)
        stack.start(
            "buffer-watch", "buffer", "watch", "--url", url, "--namespace", NAMESPACE, "--interval", "0.5"
        )
        stack.start("gen-first", "generators", *pool, "--worker-prefix", "first-", *overrides)
        stack.start("learner", "learner", "--config", "tiny", "--redis-url", url, *overrides)
        watch.until(lambda: watch.version() >= 2, 600, "version 2 (one engine)", stack)

        # 1. a second pool joins the live run (the learner paused right after a publish while its engine starts)
        rank = _process(stack.procs["learner"], "sr1.entrypoints.learner")
        published, deadline = watch.version(), time.monotonic() + scaled(300)
        while watch.version() == published and time.monotonic() < deadline:  # pause it between two publishes
            time.sleep(0.05)
        rank.suspend()
        paused_at = watch.version()
        stack.start("gen-late", "generators", *pool, "--worker-prefix", "late-", *overrides)
        engine_s = watch.until(lambda: "late-0" in watch.workers(), 600, "late-0's engine to start", stack)
        rank.resume()
        join_s = watch.until(
            lambda: watch.workers()["late-0"]["metrics"]["rollout/version"] >= paused_at,
            300,
            "late-0 to hold the learner's weights",
            stack,
        )
        first_weights = watch.workers()["late-0"]["metrics"]["rollout/version"]
        watch.until(lambda: "late-0" in watch.worker_of.values(), 300, "a group of late-0", stack)
        watch.until(
            lambda: watch.workers()["late-0"]["metrics"]["rollout/version"] > first_weights,
            300,
            "late-0 to receive a later version",
            stack,
        )

        # 2. the first pool's worker dies (SIGKILL): its leases expire and late-0 takes them
        victim = _process(stack.procs["gen-first"], "sr1.entrypoints.generators")
        killed_at = watch.version()
        victim.kill()
        learner = stack.procs["learner"]
        watch.until(lambda: learner.poll() is not None, 900, "the learner to finish", stack)
        assert learner.returncode == 0, stack.log("learner")
        watch.read_groups()
        time.sleep(3.0)  # the watcher's next look (heartbeat TTL 8 s has long passed for first-0)
        watched = stack.log("buffer-watch", 200_000)
    finally:
        stack.stop_all()
        watch.client.close()

    # every step trained, each group once; every released prompt trained or still pending (none lost)
    steps = trained_steps(run_dir)
    assert [s["version"] for s in steps] == list(range(1, STEPS + 1))
    trained = [gid for s in steps for gid in s["group_ids"]]
    assert len(trained) == len(set(trained)) == STEPS * 4
    client = redis.Redis.from_url(url)
    released = released_group_ids(client, NAMESPACE, run_dir / RELEASED_RECORD)
    pending = {g.decode() for g in client.zrange(f"{NAMESPACE}:inflight", 0, -1)}
    client.close()
    server.stop()
    assert released - set(trained) - pending == set(), "released prompts neither trained nor pending"
    assert set(trained) <= released

    # the late worker's groups were trained, and after the kill it carried the run alone
    by_worker = {
        w: [s["version"] for s in steps for g in s["group_ids"] if watch.worker_of.get(g) == w]
        for w in ("first-0", "late-0")
    }
    assert by_worker["late-0"], "no group of the late worker was trained"
    assert by_worker["first-0"] and min(by_worker["first-0"]) < min(by_worker["late-0"])
    assert max(by_worker["late-0"]) == STEPS
    # the learner pushed its weights to both engines while both were there, then to the survivor alone
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    engines = {r["step"]: r.get("weight_sync/engines") for r in rows if "step" in r}
    assert 2 in engines.values(), engines
    assert engines[STEPS] == 1, engines

    # `sr1 buffer watch` listed them as they came and went
    assert "+ first-0 (generator) joined" in watched and "+ late-0 (generator) joined" in watched
    assert "- first-0 (generator) left" in watched, watched[-3000:]
    assert killed_at < STEPS  # the kill landed mid-run
    print(
        f"\nlate-0: engine up in {engine_s:.0f}s (learner paused at version {paused_at}), weights v{first_weights} "
        f"{join_s:.0f}s after the learner went on, first trained group at step {min(by_worker['late-0'])}; first-0 "
        f"killed at version {killed_at}, its last trained group at step {max(by_worker['first-0'])}; steps with "
        f"groups of first-0: {len(set(by_worker['first-0']))}, of late-0: {len(set(by_worker['late-0']))}"
    )


@pytest.mark.long  # a generator frozen past weight_sync.timeout_s: test_chaos_freeze freezes it past the lease too
def test_an_engine_that_misses_the_last_publish_still_answers_the_final_evaluation(
    tiny_model_dir, tmp_path, free_port
):
    """The generator is frozen (SIGSTOP) while the learner trains and publishes its last step: that publish fails
    after `weight_sync.timeout_s`, and the learner asks for the evaluation of the final version that only this
    engine can answer. Once the generator goes on, the learner must give it the final weights again (it is the
    only one who can) and record the evaluation; before, it waited `eval.timeout_s` for an answer that could never
    come (an engine evaluating with pinned weights during the last publish missed it the same way)."""
    from config import load_config
    from sr1.launch.redis_server import LocalRedis

    steps = 4
    run_dir, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    overrides = run_overrides(
        tmp_path,
        tiny_model_dir,
        free_port,
        run_dir,
        f"learner.total_steps={steps}",
        f"learner.checkpoint_every={steps}",
        "learner.max_staleness=2",
        "learner.num_engines=1",
        f"eval.every_steps={steps}",
        "eval.timeout_s=300",
        "buffer.lease_s=120",
        "buffer.heartbeat_ttl_s=120",
        "weight_sync.timeout_s=10",
    )
    stack = Stack(logs)
    server = LocalRedis(tmp_path / "redis").start()
    watch = Watch(server.url)
    try:
        serve_retrieval(stack, watch, overrides, free_port)
        stack.start(
            "gen",
            "generators",
            "--config",
            "tiny",
            "--redis-url",
            server.url,
            "--num-engines",
            "1",
            "--worker-prefix",
            "gen-",
            *overrides,
        )
        stack.start("learner", "learner", "--config", "tiny", "--redis-url", server.url, *overrides)
        # the learner paused right after publishing the next-to-last version, with a batch for the last step queued
        watch.until(lambda: watch.version() >= 1, 600, "version 1", stack)
        rank = _process(stack.procs["learner"], "sr1.entrypoints.learner")
        while watch.version() < steps - 1:
            time.sleep(0.02)
        rank.suspend()
        assert watch.version() == steps - 1, "the learner went past the next-to-last version before its pause"
        # every group the run trains on exists: queued, or already taken by the learner (it may take the last step's
        # batch in the moment between publishing the version and its pause); none is acked before the last step's
        # checkpoint, and the tiny preset drops none
        per_step = load_config("tiny", overrides).learner.groups_per_step
        watch.until(
            lambda: watch.produced_unacked() >= steps * per_step, 300, "a batch for the last step", stack
        )
        generator = _process(stack.procs["gen"], "sr1.entrypoints.generators")
        generator.suspend()
        rank.resume()
        watch.until(
            lambda: f"weight sync of version {steps} failed" in stack.log("learner", 100_000),
            300,
            "the last publish to fail",
            stack,
        )
        generator.resume()
        learner = stack.procs["learner"]
        waited = watch.until(lambda: learner.poll() is not None, 600, "the learner to finish", stack)
        assert learner.returncode == 0, stack.log("learner")
    finally:
        stack.stop_all()
        watch.client.close()
        server.stop()

    from evaluation import read_evals

    evals = {e["step"]: e for e in read_evals(run_dir)}
    assert steps in evals, f"the final evaluation was never answered:\n{stack.log('learner')}"
    assert evals[steps]["eval/version"] == steps  # answered with the final weights, not the ones it held
    print(f"\nthe final evaluation was answered {waited:.0f}s after the generator went on")
