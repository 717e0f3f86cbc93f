"""Real gloo process groups of learner ranks on loopback, for the multi-rank tests of the learner.

def rank_main(rank, world_size, port, *args):
    with gloo_rank(rank, world_size, port) as world:      # a learner.distributed.World
        ...
run_ranks(rank_main, world_size, port, *args)              # world_size processes, or this one for one rank
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def gloo_rank(rank: int, world_size: int, port: int) -> Iterator[Any]:
    """Join a CPU gloo group as `rank` of `world_size` (rendezvous on 127.0.0.1:`port`; one rank needs none and may
    run inside pytest), torch at one thread (the ranks share the machine's cores); shut down and restored after."""
    if world_size > 1:
        os.environ.update(
            {
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
        )
    import torch

    from learner.distributed import init_distributed, shutdown_distributed

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    world = init_distributed("cpu")
    try:
        yield world
    finally:
        shutdown_distributed()
        torch.set_num_threads(threads)


def run_ranks(rank_main: Callable[..., None], world_size: int, *args: Any) -> None:
    """`rank_main(rank, world_size, *args)` on `world_size` spawned processes (joined; a failing rank fails the
    call), or in this process when `world_size` is 1."""
    if world_size == 1:
        rank_main(0, 1, *args)
        return
    import torch.multiprocessing as mp

    mp.spawn(rank_main, args=(world_size, *args), nprocs=world_size, join=True)
