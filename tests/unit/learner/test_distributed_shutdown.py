"""Two gloo ranks leave the process group together: rank 0 leaves last, after its peer has destroyed its group, and
a peer that died after the final barrier costs the survivor a warning, not a hang."""

from __future__ import annotations

import json
import os
import time

import torch.multiprocessing as mp

from tests.timing import scaled


def _rank(rank: int, port: int, peer_dies: bool, out: str) -> None:
    import torch
    import torch.distributed as dist

    from learner.distributed import shutdown_distributed

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    dist.all_reduce(torch.ones(4))
    times = {}
    barrier, destroy = dist.barrier, dist.destroy_process_group

    def slow_barrier() -> None:  # rank 1 lingers after the last collective has returned
        barrier()
        times["barrier_returned"] = time.time()
        if peer_dies:
            os._exit(0)  # gone after the barrier, before saying goodbye
        time.sleep(1.0)

    def timed_destroy() -> None:
        times["destroy"] = time.time()
        destroy()
        times["destroyed"] = time.time()

    if rank == 1:
        dist.barrier = slow_barrier
    dist.destroy_process_group = timed_destroy
    shutdown_distributed(timeout_s=3.0)
    with open(f"{out}/rank{rank}", "w") as f:
        json.dump(times, f)


def _run(tmp_path, free_port, peer_dies: bool) -> tuple[list[int | None], dict[int, dict[str, float]]]:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, free_port, peer_dies, str(tmp_path))) for r in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(scaled(60))
        if proc.is_alive():
            proc.kill()
    times = {
        r: json.loads((tmp_path / f"rank{r}").read_text())
        for r in range(2)
        if (tmp_path / f"rank{r}").exists()
    }
    return [proc.exitcode for proc in procs], times


def test_rank_0_tears_down_only_after_its_peer_is_past_the_last_collective(tmp_path, free_port):
    codes, times = _run(tmp_path, free_port, peer_dies=False)
    assert codes == [0, 0]
    # rank 1 lingered 1 s after its barrier returned; a bare barrier would let rank 0 tear down at once
    assert times[0]["destroy"] >= times[1]["barrier_returned"] + 0.9
    # and rank 0 tears its connections down only once rank 1 has torn its own down
    assert times[0]["destroy"] >= times[1]["destroyed"]


def test_a_peer_gone_after_the_barrier_costs_a_timeout_not_a_hang(tmp_path, free_port):
    codes, times = _run(tmp_path, free_port, peer_dies=True)
    assert codes == [0, 0]
    assert "destroy" in times[0]  # waited out its 3 s goodbye timeout, then left
