"""Kill the learner process mid-run, restart it from its checkpoint: the version continues (never reused) and every
group is used exactly once in the history that survives (nothing lost, nothing used twice)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from tests.timing import scaled

pytestmark = pytest.mark.slow  # several processes, or many steps: `make test-fast` leaves it out

NAMESPACE = "resume"


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [r for r in rows if "step" in r]  # not the segment markers


def _start(config_path: Path, redis_url: str, *extra: str, env: dict | None = None, log: Path | None = None):
    env = os.environ | {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"} | (env or {})
    cmd = [
        sys.executable,
        "-m",
        "sr1.entrypoints.learner",
        "--config",
        str(config_path),
        "--redis-url",
        redis_url,
        *extra,
    ]
    out = open(log, "ab") if log is not None else None  # noqa: SIM115 - the child writes it until it exits
    try:
        return subprocess.Popen(
            cmd,
            env=env,
            cwd=Path(__file__).resolve().parents[2],
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
        )
    finally:
        if out is not None:
            out.close()


def _stop(generator, processes: list[subprocess.Popen]) -> None:
    """Stop the toy generator and kill the learner processes still running (a failed assertion left them)."""
    generator.stop()
    for proc in processes:
        if proc.poll() is None:
            proc.kill()


def _wait_for_version(proc: subprocess.Popen, run_dir: Path, version: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + scaled(timeout_s)
    while time.monotonic() < deadline:
        if any(m["learner/version"] >= version for m in _metrics(run_dir)):
            return
        assert proc.poll() is None, f"learner exited early with {proc.returncode}"
        time.sleep(0.05)
    raise AssertionError(f"learner did not reach version {version} in {timeout_s} s")


def _run_config(tmp_path: Path, model_dir: Path, namespace: str, *overrides: str) -> tuple[Path, Path]:
    """A learner job of the tiny preset on 400 short prompts (the learner drops those longer than
    model.max_prompt_tokens), two groups of two per step, no engines (the toy generator stands in): its config file
    and run directory."""
    from config import load_config, save_config

    run_dir = tmp_path / "run"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": [{"role": "user", "content": f"q{i}"}], "golden_answers": ["a"]}) + "\n"
            for i in range(400)
        )
    )
    common = [
        f"model.path={model_dir}",
        f"run_dir={run_dir}",
        f"data.train_files=[{prompts}]",
        f"buffer.namespace={namespace}",
        "generators.group_size=2",
        "learner.groups_per_step=2",
        "learner.micro_batch_tokens=512",
        "learner.num_engines=0",
    ]
    return save_config(load_config("tiny", [*common, *overrides]), run_dir), run_dir


# well past the SIGTERM at version 6: a fast machine may finish a few steps between the poll and the signal
TOTAL_STEPS = 12


@pytest.mark.timeout(400)
def test_kill_and_resume_uses_every_group_once(tiny_model_dir, redis_url, tmp_path):
    from buffer.redis_buffer import ReplayBuffer
    from tests.fakes.toy_generator import ToyGenerator

    config_path, run_dir = _run_config(
        tmp_path,
        tiny_model_dir,
        NAMESPACE,
        "learner.max_staleness=1",
        f"learner.total_steps={TOTAL_STEPS}",
        "learner.checkpoint_every=3",
    )
    # a fixed uniform behaviour policy (no weights to follow): this test is about the plumbing
    generator = ToyGenerator(redis_url, NAMESPACE, group_size=2, targets={1, 2, 3}, response_len=3).start()
    try:
        # 1. crash after the checkpoint at version 3, mid-way to the next one
        first = _start(config_path, redis_url)
        _wait_for_version(first, run_dir, 4)
        first.send_signal(signal.SIGKILL)
        first.wait(scaled(30))
        checkpoint = int((run_dir / "checkpoints" / "latest").read_text().split("_")[1])
        assert checkpoint == 3
        # 2. restart from the checkpoint; SIGTERM mid-way finishes the step, checkpoints and exits 0
        second = _start(config_path, redis_url, "--resume")
        _wait_for_version(second, run_dir, 6)
        second.send_signal(signal.SIGTERM)
        assert second.wait(scaled(60)) == 0
        graceful = int((run_dir / "checkpoints" / "latest").read_text().split("_")[1])
        assert graceful >= 6
        # 3. a third start finishes the run
        third = _start(config_path, redis_url, "--resume")
        assert third.wait(scaled(120)) == 0
    finally:
        _stop(generator, [p for p in locals().values() if isinstance(p, subprocess.Popen)])

    # each process writes a start line then one line per step; the durable history is, per process, the steps up
    # to the checkpoint the next process resumed from
    runs: list[list[dict]] = []
    for line in (run_dir / "learner_groups.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "start" in record:
            runs.append([])
        else:
            runs[-1].append(record)
    # the version continues from the last published one (the crashed run's) and is never reused
    # (the kill may land between publishing a version and logging its step: then one more was published)
    assert runs[1][0]["version"] - 1 in (runs[0][-1]["version"], runs[0][-1]["version"] + 1)
    assert runs[2][0]["version"] == graceful + 1
    durable = [s for s in runs[0] if s["version"] <= checkpoint] + [
        s for s in runs[1] if s["version"] <= graceful
    ]
    durable += runs[2]
    versions = [s["version"] for s in durable]
    assert versions == sorted(set(versions)) and versions[-1] == TOTAL_STEPS
    used = [gid for s in durable for gid in s["group_ids"]]
    assert len(used) == len(set(used))  # nothing used twice
    assert len(used) >= 2 * len(durable)  # (a step after a replay may take more than groups_per_step)
    buffer = ReplayBuffer(redis_url, NAMESPACE)
    remaining = {
        fields[b"gid"].decode() for _, fields in redis.Redis.from_url(buffer.url).xrange(buffer.key("groups"))
    }
    assert not remaining & set(used)  # used groups are acked and gone
    assert (
        set(generator.put_ids) == set(used) | remaining
    )  # nothing lost: every produced group is used or waiting
    buffer.close()


@pytest.mark.timeout(400)
@pytest.mark.long  # the kill and resume above covers the restart; this adds the adaptive bound's state
def test_an_adaptive_bound_survives_a_restart(tiny_model_dir, redis_url, tmp_path):
    """`learner.max_staleness: auto` rising every step (target far above any mismatch): a learner stopped at version
    5 and resumed goes on with the bound it had reached (checkpoint and Redis), not from `initial` again; every step
    asserted its tokens against the bound in force (a violation would have failed the process)."""
    from buffer.redis_buffer import ReplayBuffer
    from tests.fakes.toy_generator import ToyGenerator

    namespace = "resume-auto"
    config_path, run_dir = _run_config(
        tmp_path,
        tiny_model_dir,
        namespace,
        "learner.max_staleness=auto",
        "learner.max_staleness.auto.ceiling=3",
        "learner.max_staleness.auto.target_kl=1e9",
        "learner.max_staleness.auto.patience=1",
        "learner.total_steps=9",
        "learner.checkpoint_every=3",
    )
    generator = ToyGenerator(redis_url, namespace, group_size=2, targets={1, 2, 3}, response_len=3).start()
    try:
        first = _start(config_path, redis_url)
        _wait_for_version(first, run_dir, 5)
        first.send_signal(signal.SIGTERM)
        assert first.wait(scaled(60)) == 0
        state = json.loads(
            (
                run_dir
                / "checkpoints"
                / (run_dir / "checkpoints" / "latest").read_text().strip()
                / "resume"
                / "state.json"
            ).read_text()
        )
        assert state["extra"]["staleness"]["controller"]["bound"] == 3
        second = _start(config_path, redis_url, "--resume")
        assert second.wait(scaled(120)) == 0
    finally:
        _stop(generator, [p for p in locals().values() if isinstance(p, subprocess.Popen)])
    buffer = ReplayBuffer(redis_url, namespace)
    bounds = buffer.staleness_bounds()
    buffer.close()
    assert list(bounds.values()) == [
        0,
        1,
        2,
        3,
    ]  # risen once per step to the ceiling, never reset by the restart
    rows = _metrics(run_dir)
    assert [r["staleness/bound"] for r in rows][:4] == [0, 1, 2, 3]
    assert all(r["staleness/bound"] == 3 for r in rows[3:]) and rows[-1]["learner/version"] == 9
    assert all(r["staleness/max"] <= r["staleness/bound"] for r in rows)


# -- checkpoints that fail (docs/measurements/crashes-and-checkpoints.md, "Checkpoint faults") -------------------------


def _checkpoint_every_4(tmp_path: Path, model_dir: Path, namespace: str, total: int) -> tuple[Path, Path]:
    """A learner job of `total` steps with a checkpoint every 4 and a staleness bound of 1 (see `_run_config`)."""
    return _run_config(
        tmp_path,
        model_dir,
        namespace,
        "learner.max_staleness=1",
        f"learner.total_steps={total}",
        "learner.checkpoint_every=4",
    )


def _when_latest_is(proc: subprocess.Popen, run_dir: Path, name: str, timeout_s: float = 120) -> None:
    """Wait until checkpoint `name` is complete, then freeze the learner (SIGSTOP): the caller injects a fault at
    exactly that point and lets it go on (SIGCONT)."""
    latest = run_dir / "checkpoints" / "latest"
    deadline = time.monotonic() + scaled(timeout_s)
    while not (latest.is_file() and latest.read_text().strip() == name):
        assert proc.poll() is None, f"learner exited early with {proc.returncode}"
        assert time.monotonic() < deadline, f"no {name} after {timeout_s} s"
        time.sleep(0.02)
    proc.send_signal(signal.SIGSTOP)


def _surviving_groups(run_dir: Path) -> tuple[list[int], list[str]]:
    """The versions and group ids of the steps the final weights contain (a later start drops the steps after the
    checkpoint it loaded)."""
    kept: list[dict] = []
    for line in (run_dir / "learner_groups.jsonl").read_text().splitlines():
        record = json.loads(line)
        kept = (
            [s for s in kept if s["version"] <= record["weights"]] if "start" in record else [*kept, record]
        )
    return [s["version"] for s in kept], [g for s in kept for g in s["group_ids"]]


def _assert_every_group_once(
    run_dir: Path, redis_url: str, namespace: str, generator, total_steps: int
) -> None:
    from buffer.redis_buffer import ReplayBuffer

    versions, used = _surviving_groups(run_dir)
    assert versions == sorted(set(versions)) and versions[-1] == total_steps
    assert len(used) == len(set(used))  # nothing trained twice in the surviving history
    buffer = ReplayBuffer(redis_url, namespace)
    client = redis.Redis.from_url(buffer.url)
    queued = {fields[b"gid"].decode() for _, fields in client.xrange(buffer.key("groups"))}
    in_flight = set(buffer.inflight())  # released, not acked: queued, or a prompt not generated (again) yet
    buffer.close()
    assert not queued & set(used)
    assert set(generator.put_ids) <= set(used) | in_flight  # nothing lost


@pytest.mark.timeout(400)
def test_a_full_disk_fails_two_checkpoints_stops_and_resumes_from_the_last_good_one(
    tiny_model_dir, redis_url, tmp_path
):
    """The disk fills up once step_4 is written: step_8 fails and training goes on (its groups stay unacked), step_12
    fails too and the learner stops with EXIT_CHECKPOINT_FAILED saying how much space it needs. Space freed, the
    resume goes on from step_4; the run's last checkpoint then fails once more and is retried until it is written."""
    from buffer.redis_buffer import ReplayBuffer
    from config import EXIT_CHECKPOINT_FAILED
    from learner.checkpoints.files import DISK_FULL_ENV
    from tests.fakes.toy_generator import ToyGenerator

    namespace, total = "disk-full", 16
    config_path, run_dir = _checkpoint_every_4(tmp_path, tiny_model_dir, namespace, total)
    trigger, log = tmp_path / "disk-full", tmp_path / "learner.log"
    hook = {DISK_FULL_ENV: str(trigger)}
    generator = ToyGenerator(redis_url, namespace, group_size=2, targets={1, 2, 3}, response_len=3).start()
    try:
        first = _start(config_path, redis_url, env=hook, log=log)
        _when_latest_is(first, run_dir, "step_4")
        trigger.write_text("30000")  # step_8's weights file gets 30 kB, then ENOSPC
        first.send_signal(signal.SIGCONT)
        assert first.wait(scaled(120)) == EXIT_CHECKPOINT_FAILED
        text = log.read_text()
        assert "checkpoint step_8 failed" in text and "Training goes on" in text
        assert "2 checkpoints in a row could not be written (step 8, step 12)" in text
        assert "The last good checkpoint is step_4" in text and "needs about" in text
        assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "step_4"]
        rows = {r["step"]: r for r in _metrics(run_dir)}
        assert rows[8]["checkpoint/failed_in_a_row"] == 1 and rows[8]["checkpoint/last_good_step"] == 4
        assert rows[4]["checkpoint/failed_in_a_row"] == 0
        assert rows[12]["checkpoint/failed_in_a_row"] == 2  # the step that stopped the run logged its row
        buffer = ReplayBuffer(redis_url, namespace)
        assert buffer.stats()["buffer/trained_unacked"] == 2 * 8  # steps 5-12: never acked
        buffer.close()

        # the resume goes on at version 13 (12 was published) from step_4: the first checkpoint it writes is the
        # run's last (step_16), which finds the disk still full, waits and is tried again once there is space
        trigger.write_text("")
        second = _start(config_path, redis_url, "--resume", env=hook, log=log)
        deadline = time.monotonic() + scaled(120)
        while "the run's last checkpoint (step 16) is tried again" not in log.read_text():
            assert second.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        trigger.unlink()
        assert second.wait(scaled(120)) == 0
    finally:
        _stop(generator, [p for p in locals().values() if isinstance(p, subprocess.Popen)])
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_16"
    _assert_every_group_once(run_dir, redis_url, namespace, generator, total)


@pytest.mark.timeout(400)
def test_a_torn_checkpoint_is_skipped_and_the_run_resumes_from_the_one_before(
    tiny_model_dir, redis_url, tmp_path
):
    """Issue 41's reproduction: killed once step_8 exists, step_8's files cut to half their size, resumed: the
    learner verifies step_8, names what is torn, loads step_4, and generates again the groups step_8 had acked."""
    from learner.checkpoints.files import MANIFEST
    from tests.fakes.toy_generator import ToyGenerator

    namespace, total = "torn", 16
    config_path, run_dir = _checkpoint_every_4(tmp_path, tiny_model_dir, namespace, total)
    log = tmp_path / "learner.log"
    generator = ToyGenerator(redis_url, namespace, group_size=2, targets={1, 2, 3}, response_len=3).start()
    try:
        first = _start(config_path, redis_url, log=log)
        _when_latest_is(first, run_dir, "step_8")
        first.send_signal(signal.SIGKILL)
        first.wait(scaled(30))
        step_8 = run_dir / "checkpoints" / "step_8"
        cut = [p for p in step_8.rglob("*") if p.is_file() and p.stat().st_size > 4096 and p.name != MANIFEST]
        for path in cut:
            os.truncate(path, path.stat().st_size // 2)
        second = _start(config_path, redis_url, "--resume", log=log)
        assert second.wait(scaled(180)) == 0, log.read_text()[-3000:]
    finally:
        _stop(generator, [p for p in locals().values() if isinstance(p, subprocess.Popen)])
    text = log.read_text()
    assert f"skipping checkpoint {step_8}" in text and "cut short" in text and "resuming from step_4" in text
    starts = [
        json.loads(x) for x in (run_dir / "learner_groups.jsonl").read_text().splitlines() if '"start"' in x
    ]
    assert starts[1]["weights"] == 4 and starts[1]["skipped"][0]["checkpoint"] == "step_8"
    # the first process's steps after step_4 (steps 5-8 were acked by the torn step_8): all generated again
    assert set(_groups_of_first_segment_after(run_dir, 4)) <= set(starts[1]["recalled"])
    _assert_every_group_once(run_dir, redis_url, namespace, generator, total)


def _groups_of_first_segment_after(run_dir: Path, version: int) -> list[str]:
    """The group ids the first learner process trained in its steps after `version`."""
    lines = [json.loads(x) for x in (run_dir / "learner_groups.jsonl").read_text().splitlines()]
    second_start = [i for i, r in enumerate(lines) if "start" in r][1]
    return [g for r in lines[1:second_start] if r["version"] > version for g in r["group_ids"]]
