"""Engine-side receive of one update: join the broadcasts of every bucket and return the named tensors.

Used by the vLLM worker extension (`vllm_extension.py`) and by the transport benchmark's plain receiver
processes, so both measure and run the same code. All buckets are posted at once (they complete in order);
the full set is held until the caller loads it, because vLLM's in-place reload processes a layer only once all of
its pieces arrived (a fused qkv or gate_up projection can straddle two buckets).
"""

from __future__ import annotations

import torch

from weight_sync.buckets import bucket_offsets, unpack
from weight_sync.process_group import SyncGroup, WeightSyncError


def receive_update(
    group: SyncGroup, update: dict, pool: dict[int, torch.Tensor] | None = None
) -> list[tuple[str, torch.Tensor]]:
    """Receive every bucket of `update` from rank 0; returns (name, tensor) views into the received buffers.

    `pool` (bucket index -> byte buffer), when given, keeps the receive buffers between updates: fresh large
    allocations are page-faulted in while the bytes arrive, which costs a visible share of the bandwidth on CPU.
    The views returned are only valid until the next update received into the same pool.
    """
    if update["epoch"] != group.epoch:
        raise WeightSyncError(
            f"update version {update['version']} belongs to weight-sync epoch {update['epoch']} but this engine "
            f"is in epoch {group.epoch}; re-join the group first"
        )
    buckets = update["buckets"]
    buffers, works = [], []
    for bucket in buckets:
        _, nbytes = bucket_offsets(bucket)
        if pool is None:
            buffer = torch.empty(nbytes, dtype=torch.uint8, device=group.device)
        else:
            held = pool.get(len(buffers))
            if held is None or held.numel() < nbytes or held.device != group.device:
                held = pool[len(buffers)] = torch.empty(nbytes, dtype=torch.uint8, device=group.device)
            buffer = held[:nbytes]
        buffers.append(buffer)
        works.append(group.broadcast(buffer))
    out: list[tuple[str, torch.Tensor]] = []
    for k, (bucket, buffer, work) in enumerate(zip(buckets, buffers, works, strict=True)):
        group.wait(work, f"receiving bucket {k + 1}/{len(buckets)} of version {update['version']}")
        out.extend(unpack(buffer, bucket))
    return out
