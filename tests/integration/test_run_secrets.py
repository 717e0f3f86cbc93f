"""Secrets never leave the process, end to end: `sr1 run` on the tiny preset with wandb (offline), a Redis that
needs a password and a retrieval server that needs a token, both given on its command line; a few steps, then no
file of the run directory (logs, job files, config.yaml, the run lock, wandb's offline folder, metrics, checkpoints)
holds the password or the token, though the run used both."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys

import pytest

from sr1.launch.redis_server import LocalRedis

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

STEPS = 4


@pytest.fixture
def protected_redis(tmp_path):
    """A Redis that only its ACL user with the password may use, outside the run directory (its files hold the
    password's hash and its URL, as a Redis started by someone else would)."""
    server = LocalRedis(tmp_path / "redis", password=f"pw-{secrets.token_hex(12)}", namespace="sr1").start()
    yield server
    server.stop()


def test_no_secret_lands_in_any_file_of_a_run(tmp_path, protected_redis):
    run_dir = tmp_path / "run"
    token = f"tok-{secrets.token_hex(12)}"
    password = protected_redis.password
    assert password in protected_redis.url
    cmd = [
        *(sys.executable, "-m", "sr1", "run", "tiny"),
        f"learner.total_steps={STEPS}",
        "learner.checkpoint_every=2",
        "eval.max_prompts=8",
        "eval.every_steps=0",
        "logging.wandb=true",
        "logging.wandb_mode=offline",
        f"buffer.redis_url={protected_redis.url}",
        f"retrieval.token={token}",
        *("--run-dir", str(run_dir), "--no-live"),
    ]
    env = {
        **os.environ,
        "WANDB_SILENT": "true",
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
    }
    env.pop("WANDB_API_KEY", None)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    try:
        stdout, _ = proc.communicate(timeout=1200)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        stdout, _ = proc.communicate(timeout=300)
        pytest.fail(f"sr1 run did not finish in 1200 s:\n{stdout[-4000:]}")
    assert proc.returncode == 0, f"sr1 run failed:\n{stdout[-4000:]}"
    assert password not in stdout and token not in stdout

    # the run used both secrets: it trained through the protected Redis, and its searches passed the token (a
    # refused search is a tool error)
    assert (run_dir / "checkpoints" / f"step_{STEPS}").is_dir()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "step" in row]
    assert [row["step"] for row in steps] == list(range(1, STEPS + 1))
    assert sum(row["tools/calls"] for row in steps) > 0 and all(row["tools/errors"] == 0 for row in steps)
    # wandb wrote its offline run there, its config with the URL masked
    run_id = (run_dir / "wandb_run_id").read_text().strip()
    offline = sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert offline, sorted(str(p.relative_to(run_dir)) for p in (run_dir / "wandb").rglob("*"))
    masked_url = protected_redis.url.replace(password, "***")
    assert masked_url.encode() in offline[0].read_bytes()
    assert (
        masked_url in (run_dir / "config.yaml").read_text()
        or "redis_url: null" in (run_dir / "config.yaml").read_text()
    )
    assert "'***'" in (run_dir / "jobs" / "retrieval.yaml").read_text()

    files = [p for p in run_dir.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"config.yaml", ".sr1-owner.lock", "metrics.jsonl", "learner.yaml", "learner.log"} <= names
    leaks = [
        str(p.relative_to(run_dir))
        for p in files
        if password.encode() in (data := p.read_bytes()) or token.encode() in data
    ]
    assert not leaks, f"secrets found in {leaks}"
