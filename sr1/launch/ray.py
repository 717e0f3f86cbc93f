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
was lost (its node died) gets a new actor in the same bundle, which Ray re-places. The actor, the slot and the
driver's handle are in sr1/launch/ray_host.py. Which pool a child belongs to is read from its command (the module of
`sr1/entrypoints/` it runs, or `redis-server`: `pool_of`, sr1/launch/ray_placement.py).

GPUs: with GPUs in the cluster a generator bundle holds `tensor_parallel_size` GPUs and a learner bundle one
(sr1/launch/ray_placement.py sizes the bundles); Ray sets each actor's CUDA_VISIBLE_DEVICES and its process inherits
it. Without GPUs every bundle holds one CPU (`num_cpus`): placement then follows the CPU counts the nodes were
started with. `on` adds a sliver of a resource to every bundle of a pool, which pins the pool to the nodes that have
it: a custom one (`ray start --resources='{"node2": 1}'`) or a node's built-in `node:<ip>`. Learner ranks get the
torchrun environment of rank 0's node (MASTER_ADDR, a port free there) with LOCAL_RANK 0 (Ray shows each rank its one
GPU as device 0).

`sr1 generators --ray` (or `generators.use_ray`) and `sr1 learner` with `learner.use_ray` run one pool this way;
`sr1 launch` (sr1/launch/cluster.py) runs the whole system. Every node needs the project at the same path (the same
image), and the run directory on storage they all see (job files are also copied to a node that lacks them).
"""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from config import Config
from sr1.launch.ray_host import CALL_TIMEOUT_S, RemoteChild, Slot, host_class
from sr1.launch.ray_placement import learner_bundle, pool_of
from sr1.launch.supervisor import Child, Supervisor

log = logging.getLogger("sr1.launch")

ON_SHARE = (
    0.001  # of an `on` resource per bundle: pins a pool to the nodes that have it, without rationing them
)


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
            host_class()
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
