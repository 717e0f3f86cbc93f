"""Host-device traffic of the learner's step: pinned, asynchronous host-to-device copies, and a guard that makes any
host synchronisation inside the micro-batch loop an error (or a warning) instead of a silent stall.

    mb_on_gpu = host_to_device(tensor, device)          # MicroBatch.to, the attention's boundaries and masks
    with synchronisation_check("error", device): ...    # torch.cuda.set_sync_debug_mode around the loop

A GPU step is fast only while the host runs ahead of the GPU, queueing kernels. Anything that waits for the GPU
(`.item()`, `bool(tensor)`, `.tolist()`, `.cpu()`, a copy from pageable host memory, an op whose output size depends
on device values) drains that queue. The trainer reads the device once per optimizer update (learner/model.py,
`clip_and_step`); the GPU tier runs a step with the check on to prove nothing else does (tests/gpu).
"""

from __future__ import annotations

import contextlib

import torch


def host_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`. To CUDA through pinned memory, asynchronously: the host goes on at once (no stream
    synchronisation, which copying pageable memory forces) and the copy runs in stream order before any kernel that
    reads it. The pinned buffer comes from torch's caching host allocator, which keeps it until the copy is done."""
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


@contextlib.contextmanager
def synchronisation_check(mode: str | None, device: torch.device):
    """Within the block, torch.cuda's sync debug mode `mode` ("warn" or "error"): every operation that synchronises
    the host with the GPU warns or raises. None (or a CPU device): no check."""
    if mode is None or device.type != "cuda":
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)
