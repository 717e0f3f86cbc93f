"""`sr1 launch`: the whole system on a Ray cluster — `sr1 run`'s orchestration, with every part placed by Ray.

    RAY_ADDRESS=head:6379 sr1 launch qwen2.5-3b-8xh100 model.path=/models/Qwen2.5-3B-Instruct
    sr1 launch tiny learner.total_steps=2 --on generators=node2 --on learner=node:10.0.0.1
    sr1 launch --resume runs/tiny-20261122-101500

Redis, the retrieval server, one generator worker per engine and one learner process per rank each run in a slot of a
Ray placement group (sr1/launch/ray.py): GPUs are split by the config (sr1/launch/ray_placement.py) —
`generators.num_engines` bundles of `generators.engine.tensor_parallel_size` GPUs, `learner.num_ranks` bundles of one
— and on a cluster without GPUs by one CPU each (`num_cpus`). `--on PART=RESOURCE` pins a part (redis, retrieval,
generators, learner) to the nodes that have RESOURCE: a custom resource (`ray start --resources='{"node2": 1}'`) or a
node's `node:<ip>`. Redis listens on its node's address with a password made for the run (an ACL user allowed only
sr1's commands on the run's keys; sr1/launch/redis_server.py), the retrieval server on its node's with a bearer token
made for the run (unless `retrieval.token` gives one); both reach each part in its environment (its job file holds
them masked: config/secret_env.py), and are never printed. Learner rank 0's node hosts torch.distributed's store and weight sync's
(`weight_sync.master_addr`), found once the ranks are placed. Without RAY_ADDRESS (or --ray-address) it joins a Ray
instance already running on this machine (`ray start --head`), else starts a local one with at least one logical CPU
per slot. A cluster that can never hold the run (too few CPUs or GPUs, an `--on` resource no node has) fails at once
with the numbers, before anything is placed; the run directory is locked before that, so a second launcher of a live
run holds no Ray resource.

Everything else is `sr1 run` (sr1/run.py): the run directory and its lock, the tiny world, evaluation before and
after, the report, `--resume`; the same supervisor restarts a dead part with the same bounded policy (a lost Ray
actor gets a new one in its bundle), a part that keeps dying fails the launch with its name and last log lines, and
Ctrl-C (or SIGTERM) stops the learner first (it checkpoints), then the generators, the retrieval server, Redis last,
with `sr1 run`'s grace. The live table adds each part's node, pid, state and heartbeat or last log line;
`<run_dir>/placement.json` says where each part runs. Every node needs the project at the same path and the run
directory on storage they all see.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from buffer.connection import answers_ping, mask_url
from config import Config
from config.loader import write_private
from sr1.launch.lock import RunLock
from sr1.launch.ray import RaySupervisor, place_learner
from sr1.launch.ray_host import RemoteChild
from sr1.launch.ray_placement import check_gpus, generator_bundle, learner_bundle
from sr1.launch.redis_server import run_redis
from sr1.launch.supervisor import Child, RestartPolicy
from sr1.live import LiveView
from sr1.run import Orchestrator, _update, build_parser, parse_args, run_main

PARTS = ("redis", "retrieval", "generators", "learner")
PLACEMENT_FILE = "placement.json"
Plan = dict[str, tuple[int, dict[str, float]]]  # pool -> (bundles, the resources of one bundle)


def parse_on(values: list[str]) -> dict[str, str]:
    """`["generators=node2", ...]` -> {"generators": "node2"}; a bad entry names what was expected."""
    on: dict[str, str] = {}
    for value in values:
        part, sep, resource = value.partition("=")
        if not sep or part not in PARTS or not resource:
            raise ValueError(f"--on {value!r}: expected PART=RESOURCE with PART one of {', '.join(PARTS)}")
        on[part] = resource
    return on


def plan_pools(cfg: Config, *, gpus: bool, retrieval_gpus: float = 0.0) -> Plan:
    """What each pool reserves on the cluster: Redis and the retrieval server one CPU each (when the run starts
    them), each engine `tensor_parallel_size` GPUs, each learner rank one GPU (one CPU each without GPUs)."""
    plan: Plan = {}
    if cfg.buffer.redis_url is None:
        plan["redis"] = (1, {"CPU": 1.0})
    if cfg.retrieval.serves_locally:
        plan["retrieval"] = (1, {"CPU": 1.0} | ({"GPU": retrieval_gpus} if retrieval_gpus else {}))
    plan["generators"] = (cfg.generators.num_engines, generator_bundle(cfg, gpus))
    plan["learner"] = (cfg.learner.num_ranks, learner_bundle(gpus))
    return plan


def check_fits(plan: Plan, on: dict[str, str], cluster: dict[str, float]) -> None:
    """Fail at once, with the numbers, when the cluster can never hold the plan (rather than wait for Ray)."""
    for part, resource in on.items():
        if cluster.get(resource, 0.0) <= 0:
            have = ", ".join(
                sorted(k for k in cluster if not k.startswith(("node:", "memory", "object_store")))
            )
            raise ValueError(
                f"--on {part}={resource}: no node of the Ray cluster has the resource {resource!r} "
                f"(it has: {have}; add one with `ray start --resources='{{\"{resource}\": 1}}'`)"
            )
    for resource in ("CPU", "GPU"):
        need = {pool: count * bundle.get(resource, 0.0) for pool, (count, bundle) in plan.items()}
        total = sum(need.values())
        if total > cluster.get(resource, 0.0):
            parts = " + ".join(f"{pool} {amount:g}" for pool, amount in need.items() if amount)
            raise ValueError(
                f"the run needs {total:g} {resource} ({parts}); the Ray cluster has "
                f"{cluster.get(resource, 0.0):g}"
            )


def reachable_redis_command(command: list[str], ip: str) -> list[str]:
    """A local redis-server's command (sr1/launch/redis_server.py) that also listens on `ip`, for other nodes. The
    server must have a password (its `--aclfile`): nobody else on the network may read or write the run."""
    if "--aclfile" not in command:
        raise ValueError("a Redis that listens beyond loopback needs a password (LocalRedis(password=...))")
    out = list(command)
    at = out.index("--bind")
    out[at + 1 : at + 2] = [ip, "127.0.0.1"] if ip != "127.0.0.1" else ["127.0.0.1"]
    return out  # protected mode stays on: it refuses remote clients only of a server without a password


class _LockOnce(RunLock):
    """The run lock, taken before the pools are placed on the cluster (a second launcher of a live run fails before
    it holds any Ray resource); `Orchestrator.prepare` taking it again is then a no-op."""

    def acquire(self, wait_for_dead_owner_s: float = 60.0) -> RunLock:
        return self if self.fd is not None else super().acquire(wait_for_dead_owner_s)


class ClusterOrchestrator(Orchestrator):
    """`sr1 run`'s Orchestrator whose supervisor runs every part on Ray; addresses are those of the parts' nodes."""

    command = "sr1 launch"

    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        *,
        address: str | None = None,
        on: dict[str, str] | None = None,
        retrieval_gpus: float = 0.0,
        **kwargs: Any,
    ):
        cfg = _update(_update(cfg, "generators", use_ray=True), "learner", use_ray=True)
        super().__init__(cfg, run_dir, **kwargs)
        self.lock = _LockOnce(self.run_dir, self.command)
        self.on = on or {}
        self.retrieval_gpus = retrieval_gpus
        slots = sum(count for count, _ in plan_pools(cfg, gpus=False, retrieval_gpus=retrieval_gpus).values())
        self.supervisor = RaySupervisor(
            address, placement_file=self.run_dir / PLACEMENT_FILE, local_num_cpus=slots
        )
        self.redis_url_file: Path | None = None

    def prepare(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        self.check_inputs()  # a configuration or data error holds no Ray resource
        self._reserve()
        super().prepare()

    def _reserve(self) -> None:
        """Every pool's placement group, before anything starts: a cluster that cannot hold the run fails here."""
        cfg, sup = self.cfg, self.supervisor
        gpus = check_gpus(cfg, sup.cluster_gpus)
        if not gpus:
            print(
                f"{self.command}: no GPUs in the Ray cluster: one CPU (num_cpus) per part, engine and learner rank"
            )
        import ray

        plan = plan_pools(cfg, gpus=gpus, retrieval_gpus=self.retrieval_gpus)
        check_fits(plan, self.on, ray.cluster_resources())
        timeout_s = self.startup_timeout_s
        for pool, (count, bundle) in plan.items():
            if pool != "learner":
                sup.reserve(pool, count, bundle, on=self.on.get(pool), timeout_s=timeout_s)
        # the learner's ranks last: rank 0's node is where weight sync's and torch.distributed's stores listen
        self.cfg = place_learner(sup, cfg, on=self.on.get("learner"), timeout_s=timeout_s)
        for pool, slots in sup.pools.items():
            print(
                f"{self.command}: {pool}: " + ", ".join(f"slot {s.index} on {s.node}" for s in slots),
                flush=True,
            )

    def _place_retrieval(self, cfg: Config) -> Config:
        slot = self.supervisor.slots("retrieval")[0]
        port = self.supervisor.free_port(slot)
        token = cfg.retrieval.token or secrets.token_urlsafe(32)  # the server listens beyond loopback
        retrieval = cfg.retrieval.served_at(port, host=slot.ip).model_copy(update={"token": token})
        return cfg.model_copy(update={"retrieval": retrieval})

    def _start_redis(self, cfg: Config) -> Config:
        """redis-server in its slot, on the run's AOF (`<run_dir>/redis` on that node), restarted when it dies."""
        slot = self.supervisor.slots("redis")[0]
        server = run_redis(self.run_dir, cfg.buffer, port=self.supervisor.free_port(slot))  # `sr1 run`'s ACL
        cmd = reachable_redis_command(server.command(), slot.ip)
        self.supervisor.start(
            Child("redis", cmd, server.data_dir / "redis.stdout.log", restart=RestartPolicy())
        )
        url = server.url_on(slot.ip)
        self.supervisor.wait_until(
            lambda: answers_ping(url), timeout_s=self.startup_timeout_s, what=f"Redis at {mask_url(url)}"
        )
        self.redis_url_file = server.url_file  # where `sr1 buffer watch --run-dir` finds it (owner-only)
        write_private(self.redis_url_file, url + "\n")
        admin_url = server.admin_url_on(slot.ip)  # the owner's user, as `sr1 run` writes it (owner-only)
        write_private(server.admin_url_file, f"{admin_url}\n")
        return _update(cfg, "buffer", redis_url=url)

    def make_view(self) -> LiveView:
        return ClusterView(self, enabled=self.live)

    def stop(self, interrupted: bool) -> None:
        try:
            super().stop(interrupted)
        finally:
            if self.redis_url_file is not None:
                self.redis_url_file.unlink(missing_ok=True)
                (self.redis_url_file.parent / "admin_url").unlink(missing_ok=True)
            self.supervisor.shutdown()


def part_state(child: Child) -> str:
    """What a part is doing, in a word or three."""
    if isinstance(child, RemoteChild) and child.lost:
        return "lost"
    if child.restart_at is not None:
        return f"restarting in {max(0.0, child.restart_at - time.monotonic()):.0f}s"
    if child.alive:
        return "running" + (f" ({len(child.restarts)} restarts)" if child.restarts else "")
    if child.returncode is None:
        return "not started"
    return "done" if child.returncode == 0 else f"exited {child.returncode}"


def part_rows(children: list[Child], heartbeats: list[dict]) -> list[dict[str, str]]:
    """One row per part: name, node, pid / actor pid, state, and its heartbeat's age or its last log line."""
    beats = {w.get("worker_id"): w for w in heartbeats}
    rows = []
    for child in children:
        slot = child.slot if isinstance(child, RemoteChild) else None
        worker = (
            child.name if child.name in beats else ("learner-0" if child.env.get("RANK") == "0" else None)
        )
        beat = beats.get(worker)
        last = f"heartbeat {beat.get('age_s', 0.0):.1f}s ago" if beat else ""
        line = child.last_line if isinstance(child, RemoteChild) else ""
        rows.append(
            {
                "part": child.name,
                "node": slot.node if slot else "local",
                "pid / actor": f"{child.pid or '-'} / {slot.where.get('actor_pid', '-') if slot else '-'}",
                "state": part_state(child),
                "heartbeat / last log line": " · ".join(x for x in (last, line[-90:]) if x) or "-",
            }
        )
    return rows


class ClusterView(LiveView):
    """`sr1 run`'s live table and, under it, one row per part (plain lines when a part changes state)."""

    def __init__(self, orchestrator: ClusterOrchestrator, *, enabled: bool):
        super().__init__(orchestrator, enabled=enabled)
        self._shown: dict[str, tuple[str, str]] = {}

    def rows(self) -> list[dict[str, str]]:
        try:
            heartbeats = self.orch.buffer.workers() if self.orch.buffer is not None else []
        except Exception:  # Redis restarting: the parts are still worth showing
            heartbeats = []
        return part_rows(self.orch.supervisor.children, heartbeats)

    def _table(self):
        from rich.console import Group
        from rich.table import Table

        parts = Table(title="parts", expand=False)
        for column in ("part", "node", "pid / actor", "state", "heartbeat / last log line"):
            parts.add_column(column, overflow="fold")
        for row in self.rows():
            parts.add_row(*row.values())
        return Group(super()._table(), parts)

    def refresh(self) -> None:
        super().refresh()
        if self._live is None:
            for row in self.rows():
                seen = (row["node"], row["state"])
                if self._shown.get(row["part"]) != seen:
                    self._shown[row["part"]] = seen
                    self.log(
                        f"{row['part']} on {row['node']}: {row['state']} (pid / actor {row['pid / actor']})"
                    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser("sr1 launch", __doc__)
    parser.add_argument(
        "--on",
        action="append",
        default=[],
        metavar="PART=RESOURCE",
        help=f"run PART ({', '.join(PARTS)}) on the nodes with Ray resource RESOURCE (repeatable)",
    )
    parser.add_argument(
        "--retrieval-gpus", type=float, default=0.0, help="GPUs for the retrieval server (dense)"
    )
    parser.add_argument(
        "--ray-address", default=None, help="Ray cluster (default: RAY_ADDRESS, else a local Ray)"
    )
    args = parse_args(parser, argv)
    try:
        on = parse_on(args.on)
    except ValueError as err:
        print(f"sr1 launch: {err}", file=sys.stderr)
        return 2
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # each part's own lines, not Ray's summaries of repeats
    return run_main(
        args, ClusterOrchestrator, address=args.ray_address, on=on, retrieval_gpus=args.retrieval_gpus
    )
