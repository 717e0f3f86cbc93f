"""Rank 0 keeps its followers company while it waits alone (`Hold`, learner/distributed.py): two real gloo ranks
whose process group times out after 4 s outlive a rank-0 wait of 8 s, in a wait loop of rank 0's own (`beat`) and in
work done apart (`run`); without the HOLD frames the follower's collective times out."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch.multiprocessing as mp

from tests.timing import scaled

TIMEOUT_S = 4.0  # the process group's collective timeout
STALL_S = 8.0  # how long rank 0 waits alone, twice the timeout

pytestmark = pytest.mark.slow  # two gloo ranks, 8 s stalls


def _rank(rank: int, port: int, held: bool, out: str) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from learner.distributed import Hold, World, broadcast_frames, receive_frames, wait_while_held

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=TIMEOUT_S))
    world = World(rank=rank, world_size=2, local_rank=rank, device=torch.device("cpu"), backend="gloo")
    result: dict = {}
    try:
        if rank == 0:
            hold = Hold(world, every_s=0.5)
            # 1. a wait loop of its own (as for a batch): a HOLD whenever one is due, then the real message
            hold.start()
            deadline = time.monotonic() + STALL_S
            while time.monotonic() < deadline:
                if held:
                    hold.beat()
                time.sleep(0.05)
            broadcast_frames([b'{"command": "train"}', b"payload"], world)
            # 2. work apart (as the engines' acks): in a thread, HOLDs meanwhile, then GO
            work = (lambda: time.sleep(STALL_S) or "acked") if held else None
            result["run"] = hold.run(work) if held else (time.sleep(STALL_S) or "acked")
            if not held:
                broadcast_frames([b"\x00sr1:go"], world)
        else:
            result["frames"] = [f.decode() for f in receive_frames(world)]
            wait_while_held(world)
            result["released"] = True
        dist.barrier()
        result["ok"] = True
    except Exception as err:  # the follower's timeout, reported to the test
        result["error"] = f"{type(err).__name__}: {err}"
    with open(f"{out}/rank{rank}", "w") as f:
        json.dump(result, f)
    os._exit(0)  # a timed-out gloo group cannot be torn down cleanly


def _run(tmp_path, port: int, held: bool) -> dict[int, dict]:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, port, held, str(tmp_path))) for r in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(scaled(90))
        if proc.is_alive():
            proc.kill()
    return {
        r: json.loads((tmp_path / f"rank{r}").read_text())
        for r in range(2)
        if (tmp_path / f"rank{r}").exists()
    }


def test_followers_outlive_rank_0_waiting_alone_past_the_collective_timeout(tmp_path, free_port):
    results = _run(tmp_path, free_port, held=True)
    assert results[1].get("ok"), results
    assert results[1]["frames"] == ['{"command": "train"}', "payload"]  # the HOLDs never reach the caller
    assert results[1]["released"] and results[0]["run"] == "acked" and results[0].get("ok")


def test_without_the_holds_the_follower_times_out(tmp_path, free_port):
    results = _run(tmp_path, free_port, held=False)
    assert "error" in results[1] and "ok" not in results[1], results
