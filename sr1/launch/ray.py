"""The parts of a run on a Ray cluster (`RAY_ADDRESS`, else a local Ray instance): the same processes, placed by Ray.

    sup = RaySupervisor()                                   # a Supervisor whose children run on Ray nodes
    sup.reserve("generators", 4, {"CPU": 1, "GPU": 1}, on="node2")   # a placement group, one bundle per engine
    sup.slots("generators")[0].ip                           # where a slot landed, before anything runs there
    sup.start(Child("generator-0", cmd, log_path, restart=RestartPolicy()))   # runs in the pool's next free slot
    sup.check()                                             # restarts by policy, as for local children
    sup.stop(["learner", "generator", "retrieval", "redis"])
    sup.shutdown()                                          # actors and placement groups go

Each slot of a pool is a small Ray actor (`PartHost`) in one bundle of the pool's placement group. It runs the part's
process as a `Child` on its node (own process group, log file there, killed with the actor) and answers for it. On
the driver each process is a `RemoteChild`, so the one `Supervisor` restarts it by the same bounded `RestartPolicy` as
`sr1 run`'s children (a learner's ranks as one gang) and stops parts in the same order and grace; a slot whose actor
was lost (its node died) gets a new actor in the same bundle, which Ray re-places. Which pool a child belongs to is
read from its command (the module of `sr1/entrypoints/` it runs, or `redis-server`).

GPUs: with GPUs in the cluster a generator bundle holds `tensor_parallel_size` GPUs and a learner bundle one; Ray sets
each actor's CUDA_VISIBLE_DEVICES and its process inherits it. Without GPUs every bundle holds one CPU (`num_cpus`):
placement then follows the CPU counts the nodes were started with. `on` adds a sliver of a resource to every bundle
of a pool, which pins the pool to the nodes that have it: a custom one (`ray start --resources='{"node2": 1}'`) or a
node's built-in `node:<ip>`. Learner ranks get the torchrun environment of rank 0's node (MASTER_ADDR, a port free
there) with LOCAL_RANK 0 (Ray shows each rank its one GPU as device 0).

`sr1 generators --ray` (or `generators.use_ray`) and `sr1 learner` with `learner.use_ray` run one pool this way;
`sr1 launch` (sr1/launch/cluster.py) runs the whole system. Every node needs the project at the same path (the same
image), and the run directory on storage they all see (job files are also copied to a node that lacks them).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from config import Config
from sr1 import entrypoints
from sr1.launch.supervisor import Child, Supervisor, tail

log = logging.getLogger("sr1.launch")

ON_SHARE = (
    0.001  # of an `on` resource per bundle: pins a pool to the nodes that have it, without rationing them
)
STATUS_TTL_S = 0.5  # a RemoteChild asks its host again after this long
CALL_TIMEOUT_S = (
    30.0  # a host that does not answer a short call in this long counts as unreachable (not dead)
)
LOST = -signal.SIGKILL  # the exit code reported for a process whose Ray actor (or node) was lost
# the driver's environment the parts need and Ray's workers do not inherit from it
FORWARDED_ENV_PREFIXES = (
    "HF_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "VLLM_",
    "NCCL_",
    "GLOO_",
    "TORCH_",
    "WANDB_",
)
FORWARDED_ENV = ("OMP_NUM_THREADS", "PYTHONPATH", "CUDA_LAUNCH_BLOCKING")
POOL_OF_MODULE = {
    entrypoints.GENERATORS: "generators",
    entrypoints.LEARNER: "learner",
    entrypoints.RETRIEVAL: "retrieval",
}


def pool_of(cmd: list[str]) -> str:
    """The pool a part's command belongs to: generators, learner, retrieval or redis."""
    if len(cmd) > 2 and cmd[1] == "-m" and cmd[2] in POOL_OF_MODULE:
        return POOL_OF_MODULE[cmd[2]]
    if cmd and Path(cmd[0]).name == "redis-server":
        return "redis"
    raise ValueError(
        f"no Ray pool runs {' '.join(cmd[:3])!r}: expected -m {' | '.join(POOL_OF_MODULE)} or redis-server"
    )


def generator_bundle(cfg: Config, gpus: bool) -> dict[str, float]:
    """One engine's share of the cluster: `tensor_parallel_size` GPUs, or one CPU without GPUs."""
    tp = cfg.generators.engine.tensor_parallel_size
    return {"CPU": 1.0, "GPU": float(tp)} if gpus else {"CPU": 1.0}


def learner_bundle(gpus: bool) -> dict[str, float]:
    """One learner rank's share: one GPU, or one CPU without GPUs."""
    return {"CPU": 1.0, "GPU": 1.0} if gpus else {"CPU": 1.0}


def gpus_needed(cfg: Config) -> int:
    """GPUs the run asks for: generators.num_engines x tensor_parallel_size + learner.num_ranks."""
    return cfg.generators.num_engines * cfg.generators.engine.tensor_parallel_size + cfg.learner.num_ranks


def check_gpus(cfg: Config, cluster_gpus: float) -> bool:
    """Whether to place by GPUs (the cluster has some) or by CPUs (none); too few GPUs is an error."""
    need = gpus_needed(cfg)
    if cluster_gpus and cluster_gpus < need:
        raise ValueError(
            f"the Ray cluster has {cluster_gpus:g} GPUs; the run needs generators.num_engines "
            f"({cfg.generators.num_engines}) x generators.engine.tensor_parallel_size "
            f"({cfg.generators.engine.tensor_parallel_size}) + learner.num_ranks ({cfg.learner.num_ranks}) = {need}"
        )
    return cluster_gpus > 0


def forwarded_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The driver's variables every part gets (model hub, vLLM, NCCL, wandb, threads)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k in FORWARDED_ENV or k.startswith(FORWARDED_ENV_PREFIXES)}


def job_files(cmd: list[str]) -> dict[str, str]:
    """The YAML files a command names (its job config), to be written on a node that lacks them."""
    files = {}
    for arg in cmd:
        if arg.endswith((".yaml", ".yml")) and os.path.isfile(arg):
            files[os.path.abspath(arg)] = Path(arg).read_text()
    return files


class PartHost:
    """A Ray actor (one per slot) that runs one part's process on its node and reports on it."""

    def __init__(self, cwd: str):
        if os.path.isdir(cwd):  # relative paths in a user's config mean what they mean on the driver
            os.chdir(cwd)
        # Ray sets OMP_NUM_THREADS to the actor's CPUs; a part sets its own threads (the driver's value is forwarded)
        os.environ.pop("OMP_NUM_THREADS", None)
        self.child: Child | None = None

    def where(self) -> dict[str, Any]:
        import ray

        return {
            "ip": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "hostname": socket.gethostname(),
            "actor_pid": os.getpid(),
            "gpus": [str(g) for g in ray.get_gpu_ids()],
        }

    def free_port(self) -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def start(
        self, name: str, cmd: list[str], env: dict[str, str], log_path: str | None, files: dict[str, str]
    ) -> int:
        for path, text in files.items():
            target = Path(path)
            if not target.is_file() or target.read_text() != text:
                target.parent.mkdir(parents=True, exist_ok=True)
                temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
                temp.write_text(text)
                temp.replace(target)
        self.child = Child(name, cmd, Path(log_path) if log_path else None, env).start()
        return self.child.pid

    def status(self) -> dict[str, Any]:
        child = self.child
        if child is None:
            return {"pid": None, "returncode": None, "group_alive": False, "last_line": ""}
        last = tail(child.log_path, 1) if child.log_path else ""
        return {
            "pid": child.pid,
            "returncode": child.returncode,
            "group_alive": child.group_alive(),
            "last_line": last,
        }

    def tail(self, lines: int) -> str:
        if self.child is None or self.child.log_path is None:
            return "(output not captured: see the driver's console)"
        return tail(self.child.log_path, lines)

    def send(self, sig: int) -> None:
        if self.child is not None:
            self.child.send(sig)

    def stop(self, grace_s: float, first: int) -> int | None:
        return None if self.child is None else self.child.stop(grace_s=grace_s, first=first)


@functools.cache
def _host_class():
    import ray

    return ray.remote(max_restarts=0)(PartHost)


@dataclass
class Slot:
    """One bundle of a pool's placement group and the actor that runs a part there."""

    pool: str
    index: int
    placement_group: Any
    bundle: dict[str, float]
    actor: Any = None
    where: dict[str, Any] = field(default_factory=dict)  # ip, node_id, hostname, actor_pid, gpus
    child_name: str | None = None

    @property
    def ip(self) -> str:
        return self.where.get("ip", "?")

    @property
    def node(self) -> str:
        """Host name, address and the start of the Ray node id."""
        return f"{self.where.get('hostname', '?')} {self.ip} {self.where.get('node_id', '?')[:8]}"


@dataclass
class RemoteChild(Child):
    """A `Child` whose process runs in a Ray slot; its state is asked of the slot's actor (cached briefly)."""

    slot: Slot | None = None
    supervisor: RaySupervisor | None = None
    lost: str = ""  # why the slot's actor is gone, when it is
    _status: dict[str, Any] = field(
        default_factory=lambda: {"pid": None, "returncode": None, "group_alive": False, "last_line": ""}
    )
    _status_at: float = 0.0

    @classmethod
    def adopting(cls, child: Child, slot: Slot, supervisor: RaySupervisor) -> RemoteChild:
        values = {f.name: getattr(child, f.name) for f in dataclasses.fields(Child)}
        return cls(**values, slot=slot, supervisor=supervisor)

    # -- state ---------------------------------------------------------------------------------------------------
    def apply_status(self, status: dict[str, Any] | None, lost: str = "") -> None:
        """Record an answer of the slot's actor (None with `lost`: the actor is gone, and the process with it)."""
        if status is None:
            self.lost = lost
            had = self._status.get("pid")
            self._status = {
                "pid": had,
                "returncode": LOST if had else None,
                "group_alive": False,
                "last_line": "",
            }
        else:
            self._status = status
        self._status_at = time.monotonic()

    def refresh(self) -> None:
        import ray

        try:
            self.apply_status(ray.get(self.slot.actor.status.remote(), timeout=CALL_TIMEOUT_S))
        except ray.exceptions.GetTimeoutError:
            self._status_at = time.monotonic()  # busy (stopping its process): keep what we knew
        except ray.exceptions.RayActorError as err:
            self.apply_status(None, lost=f"its Ray actor was lost ({type(err).__name__}: {err})"[:400])

    def _state(self) -> dict[str, Any]:
        if (
            self.slot is not None
            and self.slot.actor is not None
            and (time.monotonic() - self._status_at > STATUS_TTL_S)
        ):
            self.refresh()
        return self._status

    @property
    def pid(self) -> int | None:
        return self._status.get("pid")

    @property
    def alive(self) -> bool:
        state = self._state()
        return state["pid"] is not None and state["returncode"] is None

    @property
    def returncode(self) -> int | None:
        return self._state()["returncode"]

    @property
    def last_line(self) -> str:
        return self._status.get("last_line", "")

    def group_alive(self) -> bool:
        return bool(self._state()["group_alive"])

    # -- control -----------------------------------------------------------------------------------------------
    def start(self) -> RemoteChild:
        import ray

        if self.lost or self.slot.actor is None:
            self.supervisor.replace_actor(self.slot)
            self.lost = ""
        env = {**forwarded_env(), **{k: v for k, v in self.env.items() if k != "CUDA_VISIBLE_DEVICES"}}
        log_path = str(self.log_path) if self.log_path is not None else None
        call = self.slot.actor.start.remote(self.name, self.cmd, env, log_path, job_files(self.cmd))
        pid = ray.get(call, timeout=CALL_TIMEOUT_S)
        self.apply_status({"pid": pid, "returncode": None, "group_alive": True, "last_line": ""})
        self.slot.child_name = self.name
        return self

    def send(self, sig: int) -> None:
        if self.slot.actor is not None and not self.lost:
            self.slot.actor.send.remote(sig)  # no wait: a signal handler calls this

    def stop(self, grace_s: float = 30.0, first: int = signal.SIGINT) -> int | None:
        import ray

        if self.pid is None or self.lost:
            return self._status.get("returncode")
        try:
            code = ray.get(self.slot.actor.stop.remote(grace_s, first), timeout=grace_s + 20 + CALL_TIMEOUT_S)
        except (
            ray.exceptions.GetTimeoutError
        ):  # its host hangs: the actor goes, and the process group with it
            ray.kill(self.slot.actor)
            self.apply_status(None, lost="its Ray actor hung while stopping it and was killed")
            return LOST
        except ray.exceptions.RayActorError as err:
            self.apply_status(None, lost=f"its Ray actor was lost ({type(err).__name__})")
            return LOST
        self.apply_status(
            {"pid": self.pid, "returncode": code, "group_alive": False, "last_line": self.last_line}
        )
        return code

    def failure(self) -> str:
        import ray

        where = f"{self.log_path} on {self.slot.node}" if self.log_path else self.slot.node
        if self.lost:
            return f"{self.name} on {self.slot.node}: {self.lost}"
        try:
            last = ray.get(self.slot.actor.tail.remote(25), timeout=CALL_TIMEOUT_S)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as err:
            last = f"(could not read it: {type(err).__name__})"
        return f"{self.name} exited with code {self.returncode}; last log lines ({where}):\n{last}"


class RaySupervisor(Supervisor):
    """A `Supervisor` whose children run in Ray placement-group slots (see the module docstring)."""

    def __init__(
        self,
        address: str | None = None,
        placement_file: Path | None = None,
        local_num_cpus: int | None = None,
    ) -> None:
        super().__init__()
        self.address = address
        self.placement_file = placement_file  # rewritten whenever a part starts: where each one runs
        # CPUs of a local Ray instance started here: at least one per slot, whatever this machine's core count
        self.local_num_cpus = local_num_cpus
        self.pools: dict[str, list[Slot]] = {}
        self._masters: dict[str, tuple[str, int]] = {}  # pool -> torchrun master (rank 0's node, a free port)
        self.connected = False

    def connect(self) -> None:
        """Join `address`, else RAY_ADDRESS, else a Ray instance already running on this machine (`ray start`),
        else start a local one with `local_num_cpus` logical CPUs (a 2-core laptop still holds one slot per part)."""
        if self.connected:
            return
        import ray

        previous = signal.getsignal(signal.SIGTERM)
        address = self.address or os.environ.get("RAY_ADDRESS")
        options: dict[str, Any] = {"ignore_reinit_error": True, "logging_level": logging.WARNING}
        if address:
            ray.init(address=address, **options)
        else:
            try:
                ray.init(address="auto", **options)
            except ConnectionError:  # none running: a local instance that lives and dies with this process
                cpus = max(os.cpu_count() or 1, self.local_num_cpus or 0)
                # on loopback: nothing outside this machine joins it, so nothing of it listens beyond (its node
                # address is also where the engines find the learner's weight-sync store)
                ray.init(
                    address="local",
                    num_cpus=cpus,
                    include_dashboard=False,
                    _node_ip_address="127.0.0.1",
                    **options,
                )
        # ray.init makes SIGTERM exit at once; the launcher's own handler stops the parts in order first
        signal.signal(signal.SIGTERM, previous)
        self.connected = True

    @property
    def cluster_gpus(self) -> float:
        import ray

        self.connect()
        return float(ray.cluster_resources().get("GPU", 0.0))

    # -- placement ---------------------------------------------------------------------------------------------
    def reserve(
        self,
        pool: str,
        count: int,
        bundle: dict[str, float],
        *,
        on: str | None = None,
        timeout_s: float = 600.0,
    ) -> list[Slot]:
        """A placement group of `count` bundles for `pool` (PACK: as few nodes as fit), an actor in each; returns
        the slots once every actor answers from its node."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        self.connect()
        amounts = dict(bundle)
        if on:
            amounts[on] = amounts.get(on, 0.0) + ON_SHARE
        group = placement_group([dict(amounts) for _ in range(count)], strategy="PACK")
        try:
            ray.get(group.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(group)
            raise TimeoutError(
                f"Ray could not place the {pool} pool within {timeout_s:.0f}s: {count} bundle(s) of {amounts}; "
                f"the cluster has {_resources(ray.cluster_resources())}, free {_resources(ray.available_resources())}"
            ) from None
        slots = [Slot(pool, i, group, amounts) for i in range(count)]
        self.pools[pool] = slots
        for slot in slots:
            slot.actor = self._new_actor(slot)
        answers = ray.get([slot.actor.where.remote() for slot in slots], timeout=timeout_s)
        for slot, where in zip(slots, answers, strict=True):
            slot.where = where
        return slots

    def _new_actor(self, slot: Slot):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(
            placement_group=slot.placement_group, placement_group_bundle_index=slot.index
        )
        custom = {k: v for k, v in slot.bundle.items() if k not in ("CPU", "GPU")}
        return (
            _host_class()
            .options(
                num_cpus=slot.bundle.get("CPU", 0.0),
                num_gpus=slot.bundle.get("GPU", 0.0),
                resources=custom,
                scheduling_strategy=strategy,
            )
            .remote(os.getcwd())
        )

    def replace_actor(self, slot: Slot, timeout_s: float = 600.0) -> None:
        """A new actor in the slot's bundle (the old one was lost; Ray re-places a bundle whose node died)."""
        import ray

        if slot.actor is not None:
            ray.kill(slot.actor)
        slot.actor = self._new_actor(slot)
        slot.where = ray.get(slot.actor.where.remote(), timeout=timeout_s)
        log.warning("%s slot %d: a new Ray actor on %s", slot.pool, slot.index, slot.node)

    def slots(self, pool: str) -> list[Slot]:
        if pool not in self.pools:
            raise KeyError(f"no {pool} pool reserved on Ray (reserved: {', '.join(self.pools) or 'none'})")
        return self.pools[pool]

    def free_port(self, slot: Slot) -> int:
        """A TCP port free on the slot's node now."""
        import ray

        return int(ray.get(slot.actor.free_port.remote(), timeout=CALL_TIMEOUT_S))

    def _slot_for(self, child: Child, pool: str) -> Slot:
        slots = self.slots(pool)
        for slot in slots:  # a part started again keeps its slot
            if slot.child_name == child.name:
                return slot
        if "RANK" in child.env:  # learner rank r takes slot r: rank 0's slot is the one the addresses name
            return slots[int(child.env["RANK"])]
        free = [s for s in slots if s.child_name is None]
        if not free:
            raise ValueError(f"no free slot for {child.name}: the {pool} pool reserved {len(slots)}")
        return free[0]

    def _torchrun_env(self, pool: str, slot: Slot) -> dict[str, str]:
        """Rank 0's node and a port free there; LOCAL_RANK 0 (one GPU per actor); ranks sharing this node."""
        slots = self.slots(pool)
        if pool not in self._masters:
            self._masters[pool] = (slots[0].ip, self.free_port(slots[0]))
        addr, port = self._masters[pool]
        on_node = sum(1 for s in slots if s.where.get("node_id") == slot.where.get("node_id"))
        return {
            "MASTER_ADDR": addr,
            "MASTER_PORT": str(port),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": str(on_node),
        }

    # -- the Supervisor's operations, on Ray ----------------------------------------------------------------------
    def start(self, child: Child) -> Child:
        """Run `child` in a slot of its pool (read from its command)."""
        pool = pool_of(child.cmd)
        slot = self._slot_for(child, pool)
        if "MASTER_ADDR" in child.env:  # a learner rank: the addresses of rank 0's node, not this machine's
            child.env = {**child.env, **self._torchrun_env(pool, slot)}
        started = super().start(RemoteChild.adopting(child, slot, self))
        self.write_placement()
        return started

    def check(self, skip: Iterable[Child] = ()) -> list[Child]:
        self.refresh()
        restarted = super().check(skip)
        if restarted:
            self.write_placement()
        return restarted

    def placement(self) -> dict[str, dict[str, Any]]:
        """Where each part runs: pool, slot, pid, and its node (ip, node_id, hostname, actor_pid, gpus)."""
        return {
            c.name: {"pool": c.slot.pool, "slot": c.slot.index, "pid": c.pid, **c.slot.where}
            for c in self.children
            if isinstance(c, RemoteChild)
        }

    def write_placement(self) -> None:
        """`placement_file`, rewritten whole (a temp file, then a rename)."""
        if self.placement_file is None:
            return
        temp = self.placement_file.with_name(f".{self.placement_file.name}.tmp")
        temp.parent.mkdir(parents=True, exist_ok=True)
        temp.write_text(json.dumps(self.placement(), indent=1, sort_keys=True) + "\n")
        temp.replace(self.placement_file)

    def refresh(self) -> None:
        """Ask every slot's actor about its process at once (one round of calls, not one per property read)."""
        import ray

        remote = [
            c for c in self.children if isinstance(c, RemoteChild) and c.slot.actor is not None and not c.lost
        ]
        calls = [c.slot.actor.status.remote() for c in remote]
        if calls:
            ray.wait(calls, num_returns=len(calls), timeout=CALL_TIMEOUT_S)
        for child, call in zip(remote, calls, strict=True):
            try:
                child.apply_status(ray.get(call, timeout=0))
            except ray.exceptions.GetTimeoutError:
                pass  # busy: asked again next time
            except ray.exceptions.RayActorError as err:
                child.apply_status(None, lost=f"its Ray actor was lost ({type(err).__name__}: {err})"[:400])

    def shutdown(self) -> None:
        """Kill every slot's actor (what still runs there dies with it) and remove the placement groups."""
        if not self.connected:
            return
        import ray
        from ray.util.placement_group import remove_placement_group

        for slots in self.pools.values():
            for slot in slots:
                if slot.actor is not None:
                    ray.kill(slot.actor)
                    slot.actor = None
            if slots:
                remove_placement_group(slots[0].placement_group)
        self.pools.clear()
        ray.shutdown()
        self.connected = False


def _resources(amounts: dict[str, float]) -> str:
    shown = {k: v for k, v in amounts.items() if not k.startswith(("node:", "memory", "object_store_memory"))}
    return ", ".join(f"{k}={v:g}" for k, v in sorted(shown.items())) or "nothing"


# -- one pool on Ray (`sr1 generators --ray`, `sr1 learner` with learner.use_ray) ------------------------------------


def place_learner(
    sup: RaySupervisor, cfg: Config, *, on: str | None = None, timeout_s: float = 600.0
) -> Config:
    """Reserve the learner's ranks; returns `cfg` with weight_sync.master_addr at rank 0's node (engines reach the
    weight-sync store there)."""
    gpus = sup.cluster_gpus > 0
    if gpus and sup.cluster_gpus < cfg.learner.num_ranks:
        raise ValueError(
            f"learner.num_ranks ({cfg.learner.num_ranks}) exceeds the cluster's {sup.cluster_gpus:g} GPUs"
        )
    slots = sup.reserve("learner", cfg.learner.num_ranks, learner_bundle(gpus), on=on, timeout_s=timeout_s)
    weight_sync = cfg.weight_sync.model_copy(update={"master_addr": slots[0].ip})
    return cfg.model_copy(update={"weight_sync": weight_sync})
