"""The one place that sets up torch.distributed for the learner: `init_distributed()` and the `World` value.

Works the same under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the environment), under
`sr1 learner` (which sets those variables for each spawned rank or Ray actor) and for a single process with no
environment (world size 1 over an in-memory store). NCCL on GPU, gloo on CPU, chosen from the device.
Everything else receives the `World` as an argument.

Rank 0 alone talks to Redis and the engines, and the other ranks (the followers) wait for its word inside a
collective, which fails after the process group's timeout (`learner.collective_timeout_s`). So whenever rank 0 waits
alone (for a batch, for the engines' acks, for a new weight-sync group) it keeps them company: `Hold` sends a `HOLD`
frame every `HOLD_EVERY_S` seconds, which `receive_frames` answers by receiving again.

    hold = Hold(world)                         # rank 0
    hold.start(); ...; hold.beat()             # while waiting in its own loop: a frame when one is due
    result = hold.run(fn)                      # fn in a thread, frames meanwhile, then GO
    frames = receive_frames(world)             # followers: the next message that is not a HOLD
    wait_while_held(world)                     # followers: the other side of `hold.run`
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

# How often rank 0 tells the followers to wait on: far below any collective timeout the config allows (10 s at least)
HOLD_EVERY_S = 2.0
HOLD = b"\x00sr1:hold"  # "still busy alone: receive again" (a frame no header or payload starts with)
GO = b"\x00sr1:go"  # the end of `Hold.run`
T = TypeVar("T")


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


def receive_frames(world: World, src: int = 0) -> list[bytes]:
    """A follower's receive: the next message from `src` that is not a HOLD (each one answered by waiting again)."""
    while True:
        frames = broadcast_frames(None, world, src)
        if frames != [HOLD]:
            return frames


def wait_while_held(world: World) -> None:
    """A follower's side of rank 0's `Hold.run`: wait, however long, until rank 0 says GO."""
    if world.world_size == 1:
        return
    frames = receive_frames(world)
    if frames != [GO]:
        raise RuntimeError(f"learner ranks out of step: expected rank 0's GO, got {len(frames)} frame(s)")


class Hold:
    """Rank 0's side: keeps the followers waiting in short collectives (a HOLD frame every `every_s`) while it waits
    alone, so that no follower sits in one collective past the process group's timeout."""

    def __init__(self, world: World, every_s: float = HOLD_EVERY_S):
        self.world = world
        self.every_s = every_s
        self._last = time.monotonic()

    def start(self) -> None:
        """A wait begins: the next HOLD is due `every_s` from now."""
        self._last = time.monotonic()

    def beat(self) -> None:
        """Send a HOLD if one is due (call it often while waiting; it costs nothing in between)."""
        if self.world.world_size > 1 and time.monotonic() - self._last >= self.every_s:
            broadcast_frames([HOLD], self.world)
            self._last = time.monotonic()

    def run(self, fn: Callable[[], T]) -> T:
        """`fn()` on rank 0 while the followers wait in `wait_while_held`: in a thread, with HOLDs meanwhile, then
        GO. `fn` must not use the default process group. Its error is raised here, without a GO: the followers
        are left to time out, as when rank 0 dies."""
        if self.world.world_size == 1:
            return fn()
        result: list[T] = []
        error: list[BaseException] = []

        def call() -> None:
            try:
                if self.world.device.type == "cuda":  # the current device is per thread
                    torch.cuda.set_device(self.world.device)
                result.append(fn())
            except BaseException as err:  # re-raised in the calling thread
                error.append(err)

        worker = threading.Thread(target=call, name="sr1-rank0-alone", daemon=True)
        self.start()
        worker.start()
        while worker.is_alive():
            worker.join(timeout=min(0.1, self.every_s))
            self.beat()
        if error:
            raise error[0]
        broadcast_frames([GO], self.world)
        self._last = time.monotonic()
        return result[0]
