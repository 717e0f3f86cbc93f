"""The one place that sets up torch.distributed for the learner: `init_distributed()` and the `World` value.

Works the same under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the environment), under
`sr1 learner` (which sets those variables for each spawned rank or Ray actor) and for a single process with no
environment (world size 1 over an in-memory store). NCCL on GPU, gloo on CPU, chosen from the device.
Everything else receives the `World` as an argument.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class World:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str = "auto", timeout_s: float = 600.0) -> World:
    """Initialise the default process group (once) and return this process's World.

    device: "auto" (CUDA when available), "cpu" or "cuda".
    """
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if use_cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    backend = "nccl" if use_cuda else "gloo"
    if not dist.is_initialized():
        timeout = timedelta(seconds=timeout_s)
        if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
            dist.init_process_group(
                backend,
                rank=rank,
                world_size=world_size,
                timeout=timeout,
                device_id=dev if use_cuda else None,
            )
        elif world_size == 1:
            # A single process needs no rendezvous: an in-memory store keeps the same code path.
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        else:
            raise RuntimeError(
                f"WORLD_SIZE={world_size} but MASTER_ADDR/MASTER_PORT are not set: launch the ranks with "
                "`sr1 learner` or torchrun"
            )
    return World(rank=rank, world_size=world_size, local_rank=local_rank, device=dev, backend=backend)


def shutdown_distributed(wait_for_peers: bool = True, timeout_s: float = 60.0) -> None:
    """Leave the process group. After a normal end the ranks leave together: a gloo rank that tears its connections
    down while a peer is still inside gloo aborts that peer ("terminate called without an active exception"), and a
    barrier alone does not prevent it (rank 0 may return from the barrier before rank 1 has). So after the barrier
    each rank says so in the rendezvous store and waits for all the others to have said it; then every other rank
    destroys its process group and says so, and rank 0, whose process may host that store, destroys its own only
    after all of them. After an error (`wait_for_peers=False`) nobody waits for ranks that may never come."""
    if not dist.is_initialized():
        return
    if wait_for_peers and dist.get_world_size() > 1:
        dist.barrier()
        _leave_together(timeout_s)
    else:
        dist.destroy_process_group()


def _leave_together(timeout_s: float) -> None:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # no public accessor; stable since torch 1.x. Kept past destroy_process_group: rank 0 still serves it
    store = dist.distributed_c10d._get_default_store()
    timeout = timedelta(seconds=timeout_s)
    try:
        store.set(f"sr1/shutdown/past_last_collective/{rank}", b"1")
        store.wait([f"sr1/shutdown/past_last_collective/{r}" for r in range(world_size)], timeout)
    except RuntimeError as err:  # a peer died after the barrier: leave anyway, it cannot be aborted any more
        log.warning("leaving the process group without every peer's goodbye: %s", err)
        dist.destroy_process_group()
        return
    if rank != 0:
        dist.destroy_process_group()
        try:
            store.set(f"sr1/shutdown/destroyed/{rank}", b"1")
        except RuntimeError as err:  # rank 0 gone already: nothing is left to wait for us
            log.warning("could not tell rank 0 this rank has left: %s", err)
        return
    try:
        store.wait([f"sr1/shutdown/destroyed/{r}" for r in range(1, world_size)], timeout)
    except RuntimeError as err:
        log.warning("leaving the process group before every peer had left it: %s", err)
    dist.destroy_process_group()


def broadcast_bytes(payload: bytes | None, world: World, src: int = 0) -> bytes:
    """Send bytes from `src` to every rank (raw uint8 tensors, no pickling)."""
    if world.world_size == 1:
        assert payload is not None
        return payload
    size = torch.tensor([len(payload) if world.rank == src else 0], dtype=torch.int64, device=world.device)
    dist.broadcast(size, src)
    if world.rank == src:
        buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(world.device)
    else:
        buf = torch.empty(int(size.item()), dtype=torch.uint8, device=world.device)
    dist.broadcast(buf, src)
    return payload if world.rank == src else bytes(buf.cpu().numpy().tobytes())


def broadcast_frames(frames: list[bytes] | None, world: World, src: int = 0) -> list[bytes]:
    """Broadcast a list of byte strings (e.g. encoded groups) as one length-prefixed payload."""
    if world.world_size == 1:
        assert frames is not None
        return frames
    payload = None
    if world.rank == src:
        assert frames is not None
        header = len(frames).to_bytes(8, "little") + b"".join(len(f).to_bytes(8, "little") for f in frames)
        payload = header + b"".join(frames)
    data = broadcast_bytes(payload, world, src)
    n = int.from_bytes(data[:8], "little")
    sizes = [int.from_bytes(data[8 + 8 * i : 16 + 8 * i], "little") for i in range(n)]
    out, offset = [], 8 + 8 * n
    for size in sizes:
        out.append(data[offset : offset + size])
        offset += size
    return out


def all_reduce(tensor: torch.Tensor, world: World, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce that is a no-op for world size 1 (sum, max or min)."""
    if world.world_size > 1:
        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        dist.all_reduce(tensor, ops[op])
    return tensor


def all_gather_objects(value: Any, world: World) -> list[Any]:
    """Every rank's `value` (picklable), in rank order, on every rank."""
    if world.world_size == 1:
        return [value]
    gathered: list[Any] = [None] * world.world_size
    dist.all_gather_object(gathered, value)
    return gathered
