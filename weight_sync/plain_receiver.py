"""A receiver without vLLM: joins the weight-sync group and receives updates with the extension's own code.

Used by the tests (loopback, dead-engine handling) and by `scripts/bench_weight_sync.py`, where leaving vLLM out
means the transport alone is measured. Runs as a separate process (`multiprocessing` spawn target):

    python -m weight_sync.plain_receiver --redis-url redis://127.0.0.1:6379 --namespace run1 --worker-id r1
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)


def run_plain_receiver(
    redis_url: str,
    namespace: str,
    worker_id: str,
    num_updates: int = 1,
    save_dir: str | None = None,
    die_after_buckets: int | None = None,
    stall: bool = False,
    timeout_s: float = 60.0,
) -> None:
    """Join the current epoch, receive `num_updates` newer updates (ack each), optionally save them.

    save_dir: each version is written to `<save_dir>/v<version>.safetensors` (tests compare it with what was sent).
    die_after_buckets: exit abruptly (os._exit) after receiving this many buckets (a generator dying mid-sync).
    stall: join the group but never receive (a hung generator).
    """
    import redis
    import torch

    from weight_sync import rendezvous
    from weight_sync.buckets import bucket_offsets
    from weight_sync.group import make_group, open_store
    from weight_sync.receiver import receive_update

    r = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout_s
    info = None
    while info is None:
        info = rendezvous.read_rendezvous(r, namespace)
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"plain receiver {worker_id}: no rendezvous under {namespace!r} in {timeout_s} s"
            )
        time.sleep(0.05)
    rank = rendezvous.claim_rank(r, namespace, info["epoch"], worker_id)
    connect_timeout_s = float(info.get("join_timeout_s", info["timeout_s"])) + 10
    store = open_store(info["addr"], int(info["port"]), is_master=False, timeout_s=connect_timeout_s)
    group = make_group(
        store,
        rank=rank,
        world_size=int(info["world_size"]),
        backend=info["backend"],
        epoch=int(info["epoch"]),
        timeout_s=float(info["timeout_s"]),
        connect_timeout_s=connect_timeout_s,
    )
    if stall:
        time.sleep(timeout_s)
        os._exit(0)
    version = -1
    pool: dict | None = {} if info.get("keep_buffers", True) else None
    for _ in range(num_updates):
        update = None
        cursor = rendezvous.event_cursor(r, namespace)
        while update is None:
            update = rendezvous.latest_update(r, namespace)
            if update is not None and (int(update["version"]) <= version or update["epoch"] != group.epoch):
                update = None  # already loaded, or a publish to another epoch's group
            if update is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"plain receiver {worker_id}: no update after version {version}")
                cursor = rendezvous.wait_for_event(r, namespace, cursor, 1.0)  # as the engines do
        if die_after_buckets is not None:
            for k, bucket in enumerate(update["buckets"]):
                if k == die_after_buckets:
                    os._exit(1)  # no cleanup: the learner must notice on its own
                buffer = torch.empty(bucket_offsets(bucket)[1], dtype=torch.uint8, device=group.device)
                group.wait(group.broadcast(buffer), f"bucket {k + 1}")
            os._exit(1)
        named = receive_update(group, update, pool)
        version = int(update["version"])
        if save_dir is not None:
            from safetensors.torch import save_file

            save_file(
                {name: t.cpu().clone() for name, t in named}, str(Path(save_dir) / f"v{version}.safetensors")
            )
        rendezvous.ack_update(r, namespace, version, worker_id)
    group.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--num-updates", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    run_plain_receiver(
        args.redis_url, args.namespace, args.worker_id, args.num_updates, timeout_s=args.timeout_s
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
