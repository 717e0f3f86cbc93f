"""Bucket layout shared by sender and receivers: which tensors go in which flat byte buffer, and where.

A bucket is one flat `uint8` tensor; each entry `[name, dtype_str, shape]` occupies `numel * itemsize` bytes at an
offset aligned to `ALIGN` bytes (so a byte slice can be viewed as any dtype). Both sides derive the offsets from the
announced layout with `bucket_offsets`, so only names, dtypes and shapes travel through Redis.
"""

from __future__ import annotations

import math
from collections.abc import Container, Sequence

import torch

ALIGN = 64

Entry = tuple[str, str, list[int]]  # name, dtype string ("bfloat16"), shape


def dtype_to_str(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def str_to_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(
            f"unknown dtype {name!r} in a weight-sync layout (expected e.g. 'bfloat16', 'float32')"
        )
    return dtype


def entry_nbytes(entry: Sequence) -> int:
    _, dtype, shape = entry
    return math.prod(shape) * str_to_dtype(dtype).itemsize


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def bucket_offsets(bucket: Sequence[Sequence]) -> tuple[list[int], int]:
    """Byte offset of each entry and the bucket's size in bytes, up to the end of its last entry (no trailing
    padding: a bucket of one entry is exactly that tensor's bytes, so it can go on the wire from the tensor's own
    memory)."""
    offsets, end = [], 0
    for entry in bucket:
        offsets.append(_align(end))
        end = offsets[-1] + entry_nbytes(entry)
    return offsets, end


def plan_buckets(
    entries: Sequence[Entry],
    bucket_bytes: int,
    first_bucket_bytes: int | None = None,
    alone: Container[str] = (),
) -> list[list[Entry]]:
    """Split entries, in order, into buckets of at most `bucket_bytes` (a larger tensor gets a bucket of its own).

    `first_bucket_bytes` caps the first bucket alone: nothing is on the wire while it is gathered and packed, so
    a small first bucket starts the gather/broadcast pipeline sooner. An entry named in `alone` gets a bucket of its
    own whatever its size, so the sender can broadcast it without copying it into a bucket."""
    buckets: list[list[Entry]] = []
    current: list[Entry] = []
    size = 0
    cap = first_bucket_bytes or bucket_bytes
    for entry in entries:
        nbytes = _align(entry_nbytes(entry))
        by_itself = entry[0] in alone
        if current and (by_itself or size + nbytes > cap):
            buckets.append(current)
            current, size, cap = [], 0, bucket_bytes
        current.append(entry)
        size += nbytes
        if by_itself:
            buckets.append(current)
            current, size, cap = [], 0, bucket_bytes
    if current:
        buckets.append(current)
    return buckets


def pack_into(buffer: torch.Tensor, bucket: Sequence[Sequence], tensors: Sequence[torch.Tensor]) -> None:
    """Copy `tensors` (matching `bucket`'s entries) into the flat byte `buffer`, converting dtype as announced."""
    offsets, _ = bucket_offsets(bucket)
    for (name, dtype, shape), offset, tensor in zip(bucket, offsets, tensors, strict=True):
        if list(tensor.shape) != list(shape):
            raise ValueError(
                f"weight {name}: shape {list(tensor.shape)} differs from the announced {list(shape)}"
            )
        nbytes = entry_nbytes((name, dtype, shape))
        view = buffer[offset : offset + nbytes].view(str_to_dtype(dtype)).view(shape)
        view.copy_(tensor, non_blocking=True)


def bytes_in_place(bucket: Sequence[Sequence], tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The bucket's bytes as a view of the tensor itself, when `bucket` holds one entry and its tensor already is
    what the wire carries (announced dtype and shape, contiguous); None when it must be packed."""
    if len(bucket) != 1:
        return None
    (_, dtype, shape), tensor = bucket[0], tensors[0]
    if tensor.dtype != str_to_dtype(dtype) or list(tensor.shape) != list(shape) or not tensor.is_contiguous():
        return None
    return tensor.reshape(-1).view(torch.uint8)


def unpack(buffer: torch.Tensor, bucket: Sequence[Sequence]) -> list[tuple[str, torch.Tensor]]:
    """Views into the flat byte `buffer`, one per entry of `bucket` (no copy)."""
    offsets, _ = bucket_offsets(bucket)
    out = []
    for (name, dtype, shape), offset in zip(bucket, offsets, strict=True):
        nbytes = entry_nbytes((name, dtype, shape))
        out.append((name, buffer[offset : offset + nbytes].view(str_to_dtype(dtype)).view(shape)))
    return out
