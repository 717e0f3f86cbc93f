"""A weight-sync receiver without vLLM: joins the group and receives updates with the extension's own code.

Used by the tests (loopback, dead-engine handling); `scripts/bench/bench_weight_sync.py` builds its receivers from
`join_group` and `wait_update`, so leaving vLLM out means the transport alone is measured. Runs as a separate
process (`multiprocessing` spawn target, or from the command line):

    python -m fakes.receiver --redis-url redis://127.0.0.1:6379 --namespace run1 --worker-id r1
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

from weight_sync.process_group import SyncGroup, make_group, open_store
from weight_sync.rendezvous import Rendezvous

log = logging.getLogger(__name__)


def join_group(rv: Rendezvous, worker_id: str, timeout_s: float) -> tuple[SyncGroup, dict]:
    """Wait (up to `timeout_s`) for a rendezvous, claim a rank in its epoch and connect, as `ws_join` does (here in
    the foreground); returns the group and the rendezvous info."""
    deadline = time.monotonic() + timeout_s
    while (info := rv.read()) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"receiver {worker_id}: no rendezvous under {rv.namespace!r} in {timeout_s} s")
        time.sleep(0.05)
    rank = rv.claim_rank(info["epoch"], worker_id)
    connect_timeout_s = float(info.get("join_timeout_s", info["timeout_s"])) + 10
    store = open_store(info["addr"], int(info["port"]), is_master=False, timeout_s=connect_timeout_s)
    group = make_group(
        store,
        rank=rank,
        world_size=None,  # the learner fixes it once every engine claimed its ranks
        backend=info["backend"],
        epoch=int(info["epoch"]),
        timeout_s=float(info["timeout_s"]),
        connect_timeout_s=connect_timeout_s,
    )
    return group, info


def wait_update(
    rv: Rendezvous, group: SyncGroup, after_version: int, deadline: float, worker_id: str
) -> dict:
    """Block until an update newer than `after_version` is announced for `group`'s epoch (woken by the
    announcement, as engines are); TimeoutError at `deadline` (a `time.monotonic()` value)."""
    cursor = rv.event_cursor()
    while True:
        update = rv.latest_update()
        if update is not None and int(update["version"]) > after_version and update["epoch"] == group.epoch:
            return update
        # otherwise nothing yet, already loaded, or a publish to another epoch's group
        if time.monotonic() > deadline:
            raise TimeoutError(f"receiver {worker_id}: no update after version {after_version}")
        cursor = rv.wait_for_event(cursor, 1.0)


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
    import torch

    from weight_sync.buckets import bucket_offsets
    from weight_sync.receiver import receive_update

    deadline = time.monotonic() + timeout_s
    with Rendezvous(redis_url, namespace) as rv:
        group, info = join_group(rv, worker_id, timeout_s)
        if stall:
            time.sleep(timeout_s)
            os._exit(0)
        version = -1
        pool: dict | None = {} if info.get("keep_buffers", True) else None
        for _ in range(num_updates):
            update = wait_update(rv, group, version, deadline, worker_id)
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
                    {name: t.cpu().clone() for name, t in named},
                    str(Path(save_dir) / f"v{version}.safetensors"),
                )
            rv.ack_update(version, worker_id)
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
