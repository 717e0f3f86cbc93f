"""The weight-sync process group: learner rank 0 + every engine, built from a TCP store, never the default group.

vLLM workers (and FSDP learners) already own torch.distributed's default group, so this group is built directly
from a `TCPStore` (the learner is its master) + a per-epoch `PrefixStore` + `ProcessGroupGloo` on CPU or
`ProcessGroupNCCL` on GPU. The same code runs on both; only the device of the buffers differs.

The learner fixes the world size only once the engines have claimed their ranks (an engine claims one rank per vLLM
worker, so a tensor-parallel engine takes several), and hands it to the members through the store: rank 0 passes it
to `make_group`, which writes it under the epoch's prefix; members pass `world_size=None` and read it there.

Every blocking call takes a timeout and fails with a `WeightSyncError` saying what it was waiting for.
"""

from __future__ import annotations

import datetime
import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)


class WeightSyncError(RuntimeError):
    """A weight-sync step failed or timed out; the message says which step, which version and bucket."""


def resolve_backend(backend: str) -> str:
    """ "auto" -> nccl when CUDA is available, else gloo."""
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"weight_sync backend must be auto, gloo or nccl; got {backend!r}")
    return backend


def backend_device(backend: str) -> torch.device:
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclass
class SyncGroup:
    """One member's handle on the group: the process group, its rank, and the store that keeps it alive."""

    store: Any
    pg: Any
    rank: int
    world_size: int
    backend: str
    epoch: int
    timeout_s: float

    @property
    def device(self) -> torch.device:
        return backend_device(self.backend)

    def broadcast(self, tensor: torch.Tensor):
        """Start a broadcast from rank 0 into `tensor` (every rank); returns the async work."""
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        opts.timeout = datetime.timedelta(seconds=self.timeout_s)
        return self.pg.broadcast([tensor], opts)

    def wait(self, work, what: str) -> None:
        """Wait for `work` at most timeout_s; a dead peer or a timeout becomes a WeightSyncError naming `what`."""
        start = time.monotonic()
        try:
            work.wait(datetime.timedelta(seconds=self.timeout_s))
        except Exception as exc:  # gloo: "Connection closed by peer", timeouts; NCCL: watchdog errors
            elapsed = time.monotonic() - start
            raise WeightSyncError(
                f"weight sync (epoch {self.epoch}, rank {self.rank} of {self.world_size}, {self.backend}): "
                f"{what} failed after {elapsed:.1f} s (timeout {self.timeout_s:.0f} s): {exc}. A peer probably "
                "died or stopped receiving; the learner re-opens the group with a new epoch on the next publish."
            ) from exc
        if self.backend == "nccl":
            torch.cuda.current_stream().synchronize()

    def close(self) -> None:
        """Abort pending collectives and drop the group (groups built without init_process_group live only here)."""
        if self.pg is not None:
            try:
                self.pg.abort()
            except Exception as exc:  # a bare group that cannot abort is still released below
                log.debug("weight sync: abort failed: %s", exc)
        self.pg = None
        self.store = None


def open_store(addr: str, port: int, *, is_master: bool, timeout_s: float):
    """The TCP store (learner: master, port 0 picks a free one). Raises WeightSyncError if it cannot be reached."""
    import torch.distributed as dist

    try:
        return dist.TCPStore(
            addr,
            port,
            None,
            is_master,
            datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
    except Exception as exc:
        role = "open" if is_master else "reach"
        raise WeightSyncError(
            f"weight sync: could not {role} the TCP store at {addr}:{port} within {timeout_s:.0f} s: {exc}"
        ) from exc


def _world_size_key(epoch: int) -> str:
    return f"sr1-weight-sync/epoch{epoch}:world_size"


def _read_world_size(store, epoch: int, rank: int, timeout_s: float) -> int:
    """Member: wait for rank 0 to fix the epoch's world size; a rank outside it claimed too late."""
    key = _world_size_key(epoch)
    try:
        store.wait([key], datetime.timedelta(seconds=timeout_s))
        world_size = int(store.get(key))
    except Exception as exc:
        raise WeightSyncError(
            f"weight sync epoch {epoch}: rank {rank} got no world size from the learner within {timeout_s:.0f} s "
            f"(did the learner see every engine claim its ranks?): {exc}"
        ) from exc
    if rank >= world_size:
        raise WeightSyncError(
            f"weight sync epoch {epoch}: rank {rank} was claimed after the learner closed the group at "
            f"{world_size} members; this engine joins the learner's next epoch"
        )
    return world_size


def make_group(
    store,
    *,
    rank: int,
    world_size: int | None,
    backend: str,
    epoch: int,
    timeout_s: float,
    connect_timeout_s: float | None = None,
) -> SyncGroup:
    """Build the process group of `world_size` members on `store`; blocks until all members connect.

    Rank 0 passes the world size and publishes it in the store for the epoch; a member passing None reads it there.
    connect_timeout_s bounds the connection (members may start minutes apart); timeout_s bounds every collective.
    """
    import torch.distributed as dist

    backend = resolve_backend(backend)
    connect_timeout_s = timeout_s if connect_timeout_s is None else connect_timeout_s
    if world_size is None:
        if rank == 0:
            raise ValueError("rank 0 (the learner) fixes the world size: pass it to make_group")
        world_size = _read_world_size(store, epoch, rank, connect_timeout_s)
    elif rank == 0:
        store.set(_world_size_key(epoch), str(world_size))
    prefixed = dist.PrefixStore(f"sr1-weight-sync/epoch{epoch}", store)
    timeout = datetime.timedelta(seconds=connect_timeout_s)
    try:
        if backend == "gloo":
            pg = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
        else:
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
    except Exception as exc:
        raise WeightSyncError(
            f"weight sync epoch {epoch}: rank {rank} could not connect a {backend} group of {world_size} "
            f"members within {connect_timeout_s:.0f} s: {exc}"
        ) from exc
    if connect_timeout_s != timeout_s:
        pg._set_default_timeout(datetime.timedelta(seconds=timeout_s))
    log.info("weight sync: rank %d/%d joined epoch %d (%s)", rank, world_size, epoch, backend)
    return SyncGroup(store, pg, rank, world_size, backend, epoch, timeout_s)
