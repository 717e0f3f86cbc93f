"""`sr1 launch` without a cluster: how the config splits into Ray bundles, the checks that fail before anything is
placed (with the numbers), `--on`, the Redis command other nodes can reach, the run lock, the parts' table rows.
The launch on a real two-node Ray cluster is tests/integration/test_launch_ray.py."""

from __future__ import annotations

import signal

import pytest

from config import EXIT_BAD_INPUT, load_config
from sr1.launch.cluster import (
    _LockOnce,
    check_fits,
    main,
    parse_on,
    part_rows,
    part_state,
    plan_pools,
    reachable_redis_command,
)
from sr1.launch.lock import RunLock, RunLocked
from sr1.launch.ray_host import LOST, RemoteChild, Slot, forwarded_env
from sr1.launch.ray_placement import check_gpus, pool_of
from sr1.launch.redis_server import LocalRedis
from sr1.launch.supervisor import Child, python_module


def _cfg(*overrides: str):
    return load_config("tiny", list(overrides))


def test_gpus_split_by_engines_times_tensor_parallel_and_learner_ranks():
    cfg = _cfg(
        "generators.num_engines=2",
        "generators.engine.tensor_parallel_size=2",
        "learner.num_ranks=4",
        "learner.groups_per_step=8",
    )
    plan = plan_pools(cfg, gpus=True)
    assert plan["generators"] == (2, {"CPU": 1.0, "GPU": 2.0})
    assert plan["learner"] == (4, {"CPU": 1.0, "GPU": 1.0})
    assert plan["redis"] == (1, {"CPU": 1.0}) and plan["retrieval"] == (1, {"CPU": 1.0})
    assert check_gpus(cfg, 8.0) is True
    with pytest.raises(ValueError, match=r"has 6 GPUs.*\(2\) x .*\(2\) \+ learner.num_ranks \(4\) = 8"):
        check_gpus(cfg, 6.0)


def test_without_gpus_every_slot_is_one_cpu_and_given_parts_are_not_placed():
    cfg = _cfg("generators.num_engines=3", "buffer.redis_url=redis://head:6379/0")
    assert check_gpus(cfg, 0.0) is False
    plan = plan_pools(cfg, gpus=False, retrieval_gpus=0.5)
    assert "redis" not in plan  # the user's Redis
    assert plan["generators"] == (3, {"CPU": 1.0}) and plan["learner"] == (1, {"CPU": 1.0})
    assert plan["retrieval"] == (1, {"CPU": 1.0, "GPU": 0.5})


def test_a_cluster_too_small_or_without_the_named_resource_fails_at_once_with_the_numbers():
    plan = plan_pools(_cfg("generators.num_engines=2"), gpus=False)
    check_fits(plan, {"generators": "node2"}, {"CPU": 5.0, "node2": 1.0})
    with pytest.raises(
        ValueError,
        match=r"needs 5 CPU \(redis 1 \+ retrieval 1 \+ generators 2 \+ learner 1\); "
        r"the Ray cluster has 4",
    ):
        check_fits(plan, {}, {"CPU": 4.0})
    with pytest.raises(
        ValueError, match=r"--on learner=gpu-box: no node .* has the resource 'gpu-box' \(it has: CPU"
    ):
        check_fits(plan, {"learner": "gpu-box"}, {"CPU": 8.0, "node:10.0.0.1": 1.0})
    gpu_plan = plan_pools(_cfg("generators.engine.tensor_parallel_size=4"), gpus=True)
    with pytest.raises(ValueError, match=r"needs 5 GPU \(generators 4 \+ learner 1\); the Ray cluster has 4"):
        check_fits(gpu_plan, {}, {"CPU": 8.0, "GPU": 4.0})


def test_on_names_a_part_and_a_resource():
    assert parse_on(["generators=node2", "learner=node:10.0.0.1"]) == {
        "generators": "node2",
        "learner": "node:10.0.0.1",
    }
    for bad in ("generators", "engines=node2", "learner="):
        with pytest.raises(ValueError, match="expected PART=RESOURCE with PART one of redis, retrieval"):
            parse_on([bad])


def test_launch_rejects_bad_arguments_before_touching_ray(capsys, tmp_path):
    assert main(["tiny", "--on", "gpus=node2", "--run-dir", str(tmp_path / "a")]) == 2
    assert "--on 'gpus=node2'" in capsys.readouterr().err
    assert main(["tiny", "learner.no_such_field=1", "--run-dir", str(tmp_path / "b")]) == EXIT_BAD_INPUT
    assert "no_such_field" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_redis_listens_on_its_node_address_for_the_other_nodes(tmp_path):
    command = LocalRedis(tmp_path, port=6390, password="pw").command()
    reachable = reachable_redis_command(command, "10.0.0.7")
    assert reachable[reachable.index("--bind") + 1 : reachable.index("--bind") + 3] == [
        "10.0.0.7",
        "127.0.0.1",
    ]
    assert (
        reachable[reachable.index("--protected-mode") + 1] == "yes"
    )  # the ACL user's password lets others in
    assert reachable[reachable.index("--port") + 1] == "6390" and pool_of(reachable) == "redis"
    assert reachable_redis_command(command, "127.0.0.1")[command.index("--bind") + 1] == "127.0.0.1"


def test_each_part_runs_in_its_own_pool():
    assert pool_of(python_module("sr1.entrypoints.generators", "--config", "x.yaml")) == "generators"
    assert pool_of(python_module("sr1.entrypoints.learner", "--config", "x.yaml")) == "learner"
    assert pool_of(python_module("sr1.entrypoints.retrieval", "serve")) == "retrieval"
    with pytest.raises(ValueError, match="no Ray pool runs"):
        pool_of(python_module("world"))


def test_the_parts_get_the_drivers_library_settings_and_nothing_else():
    env = {
        "HF_HOME": "/hf",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": "2",
        "HOME": "/root",
        "RAY_ADDRESS": "x:1",
        "NCCL_DEBUG": "INFO",
    }
    assert forwarded_env(env) == {
        "HF_HOME": "/hf",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": "2",
        "NCCL_DEBUG": "INFO",
    }


def test_the_run_lock_is_taken_before_placing_and_once(tmp_path):
    lock = _LockOnce(tmp_path, "sr1 launch")
    assert lock.acquire() is lock and lock.acquire() is lock  # Orchestrator.prepare takes it again: a no-op
    with pytest.raises(RunLocked, match="in use by sr1 launch"):
        RunLock(tmp_path, "sr1 run").acquire(wait_for_dead_owner_s=0)
    lock.release()
    RunLock(tmp_path, "sr1 run").acquire().release()


def _remote(name: str, status: dict | None, lost: str = "", **env: str) -> RemoteChild:
    slot = Slot(
        "generators",
        0,
        None,
        {"CPU": 1.0},
        where={"ip": "10.0.0.2", "hostname": "node2", "node_id": "abcdef123456", "actor_pid": 77},
    )
    child = RemoteChild(name, ["python"], env=dict(env), slot=slot)
    child.apply_status(status, lost=lost)
    return child


def test_the_parts_table_shows_node_pid_state_and_heartbeat_or_last_log_line():
    running = _remote(
        "generator-0", {"pid": 10, "returncode": None, "group_alive": True, "last_line": "ready"}
    )
    rank0 = _remote(
        "learner", {"pid": 11, "returncode": None, "group_alive": True, "last_line": "step 3"}, RANK="0"
    )
    done = _remote("retrieval", {"pid": 12, "returncode": 0, "group_alive": False, "last_line": "bye"})
    lost = _remote("redis", {"pid": 13, "returncode": None, "group_alive": True, "last_line": ""})
    lost.apply_status(None, lost="its Ray actor was lost")
    beats = [{"worker_id": "generator-0", "age_s": 1.25}, {"worker_id": "learner-0", "age_s": 0.5}]
    rows = {r["part"]: r for r in part_rows([running, rank0, done, lost], beats)}
    assert rows["generator-0"]["node"] == "node2 10.0.0.2 abcdef12"
    assert rows["generator-0"]["pid / actor"] == "10 / 77" and rows["generator-0"]["state"] == "running"
    assert rows["generator-0"]["heartbeat / last log line"] == "heartbeat 1.2s ago · ready"
    assert (
        rows["learner"]["heartbeat / last log line"] == "heartbeat 0.5s ago · step 3"
    )  # rank 0 beats as learner-0
    assert rows["retrieval"]["state"] == "done" and rows["retrieval"]["heartbeat / last log line"] == "bye"
    assert rows["redis"]["state"] == "lost" and lost.returncode == LOST


def test_a_local_part_that_died_says_how():
    child = Child("x", ["sleep", "0"])
    assert part_state(child) == "not started"
    child.start().process.wait()
    assert part_state(child) == "done"
    child.cmd = ["sh", "-c", f"kill -{int(signal.SIGTERM)} $$"]
    child.start().process.wait()
    assert part_state(child) == f"exited {-int(signal.SIGTERM)}"
