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

NAMESPACE = "resume"


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [r for r in rows if "step" in r]  # not the segment markers


def _start(config_path: Path, redis_url: str, *extra: str) -> subprocess.Popen:
    env = os.environ | {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "learner.main",
        "--config",
        str(config_path),
        "--redis-url",
        redis_url,
        *extra,
    ]
    return subprocess.Popen(cmd, env=env, cwd=Path(__file__).resolve().parents[2])


def _wait_for_version(proc: subprocess.Popen, run_dir: Path, version: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(m["learner/version"] >= version for m in _metrics(run_dir)):
            return
        assert proc.poll() is None, f"learner exited early with {proc.returncode}"
        time.sleep(0.05)
    raise AssertionError(f"learner did not reach version {version} in {timeout_s} s")


# well past the SIGTERM at version 6: a fast machine may finish a few steps between the poll and the signal
TOTAL_STEPS = 12


@pytest.mark.timeout(400)
def test_kill_and_resume_uses_every_group_once(tiny_model_dir, redis_url, tmp_path):
    from buffer.redis_buffer import ReplayBuffer
    from config import load_config, save_config
    from tests.fakes.toy_generator import ToyGenerator

    run_dir = tmp_path / "run"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": [{"role": "user", "content": f"q{i}"}], "golden_answers": ["a"]}) + "\n"
            for i in range(400)
        )  # short prompts: the learner drops those longer than model.max_prompt_tokens
    )
    config = load_config(
        "tiny",
        [
            f"model.path={tiny_model_dir}",
            f"run_dir={run_dir}",
            f"data.train_files=[{prompts}]",
            f"buffer.namespace={NAMESPACE}",
            "generators.group_size=2",
            "learner.groups_per_step=2",
            "learner.max_staleness=1",
            f"learner.total_steps={TOTAL_STEPS}",
            "learner.micro_batch_tokens=512",
            "learner.checkpoint_every=3",
            "learner.num_engines=0",
        ],
    )
    config_path = save_config(config, run_dir)
    # a fixed uniform behaviour policy (no weights to follow): this test is about the plumbing
    generator = ToyGenerator(redis_url, NAMESPACE, group_size=2, targets={1, 2, 3}, response_len=3).start()
    try:
        # 1. crash after the checkpoint at version 3, mid-way to the next one
        first = _start(config_path, redis_url)
        _wait_for_version(first, run_dir, 4)
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        checkpoint = int((run_dir / "checkpoints" / "latest").read_text().split("_")[1])
        assert checkpoint == 3
        # 2. restart from the checkpoint; SIGTERM mid-way finishes the step, checkpoints and exits 0
        second = _start(config_path, redis_url, "--resume")
        _wait_for_version(second, run_dir, 6)
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0
        graceful = int((run_dir / "checkpoints" / "latest").read_text().split("_")[1])
        assert graceful >= 6
        # 3. a third start finishes the run
        third = _start(config_path, redis_url, "--resume")
        assert third.wait(120) == 0
    finally:
        generator.stop()
        for proc in [p for p in locals().values() if isinstance(p, subprocess.Popen)]:
            if proc.poll() is None:
                proc.kill()

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
def test_an_adaptive_bound_survives_a_restart(tiny_model_dir, redis_url, tmp_path):
    """`learner.max_staleness: auto` rising every step (target far above any mismatch): a learner stopped at version
    5 and resumed goes on with the bound it had reached (checkpoint and Redis), not from `initial` again; every step
    asserted its tokens against the bound in force (a violation would have failed the process)."""
    from buffer.redis_buffer import ReplayBuffer
    from config import load_config, save_config
    from tests.fakes.toy_generator import ToyGenerator

    namespace, run_dir = "resume-auto", tmp_path / "run"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": [{"role": "user", "content": f"q{i}"}], "golden_answers": ["a"]}) + "\n"
            for i in range(400)
        )
    )
    overrides = [
        f"model.path={tiny_model_dir}",
        f"run_dir={run_dir}",
        f"data.train_files=[{prompts}]",
        f"buffer.namespace={namespace}",
        "generators.group_size=2",
        "learner.groups_per_step=2",
        "learner.max_staleness=auto",
        "learner.max_staleness.auto.ceiling=3",
        "learner.max_staleness.auto.target_kl=1e9",
        "learner.max_staleness.auto.patience=1",
        "learner.total_steps=9",
        "learner.micro_batch_tokens=512",
        "learner.checkpoint_every=3",
        "learner.num_engines=0",
    ]
    config_path = save_config(load_config("tiny", overrides), run_dir)
    generator = ToyGenerator(redis_url, namespace, group_size=2, targets={1, 2, 3}, response_len=3).start()
    try:
        first = _start(config_path, redis_url)
        _wait_for_version(first, run_dir, 5)
        first.send_signal(signal.SIGTERM)
        assert first.wait(60) == 0
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
        assert second.wait(120) == 0
    finally:
        generator.stop()
        for proc in [p for p in locals().values() if isinstance(p, subprocess.Popen)]:
            if proc.poll() is None:
                proc.kill()
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
