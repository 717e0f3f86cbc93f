"""Bucket layout: planning, alignment, and an exact pack/unpack round trip with dtype conversion."""

from __future__ import annotations

import pytest
import torch

from weight_sync.buckets import (
    ALIGN,
    bucket_offsets,
    bytes_in_place,
    entry_nbytes,
    pack_into,
    plan_buckets,
    str_to_dtype,
    unpack,
)


def _entries():
    return [
        ("a", "float32", [10, 3]),  # 120 bytes
        ("b", "bfloat16", [7]),  # 14 bytes
        ("c", "float32", [1000]),  # 4000 bytes: larger than the bucket, gets its own
        ("d", "int64", [2, 2]),
        ("e", "float32", []),  # a scalar
    ]


def test_plan_keeps_order_and_respects_the_bucket_size():
    buckets = plan_buckets(_entries(), bucket_bytes=256)
    assert [e[0] for b in buckets for e in b] == ["a", "b", "c", "d", "e"]
    assert [[e[0] for e in b] for b in buckets] == [["a", "b"], ["c"], ["d", "e"]]
    for bucket in buckets:
        if len(bucket) > 1:
            assert bucket_offsets(bucket)[1] <= 256


def test_first_bucket_cap_applies_to_the_first_bucket_only():
    # a (128 aligned) fits a 130-byte first bucket, b does not; later buckets take the full 256 bytes
    buckets = plan_buckets(_entries(), bucket_bytes=256, first_bucket_bytes=130)
    assert [[e[0] for e in b] for b in buckets] == [["a"], ["b"], ["c"], ["d", "e"]]
    assert plan_buckets(_entries(), 256, first_bucket_bytes=None) == plan_buckets(_entries(), 256)


def test_entries_named_alone_get_a_bucket_of_their_own_and_order_is_kept():
    buckets = plan_buckets(_entries(), bucket_bytes=256, alone={"a"})
    assert [[e[0] for e in b] for b in buckets] == [["a"], ["b"], ["c"], ["d", "e"]]
    buckets = plan_buckets(_entries(), bucket_bytes=256, alone={"d"})
    assert [[e[0] for e in b] for b in buckets] == [["a", "b"], ["c"], ["d"], ["e"]]


def test_a_one_tensor_bucket_in_the_wire_dtype_is_sent_from_the_tensor_itself():
    weight = torch.randn(4, 6)
    bucket = [("w", "float32", [4, 6])]
    view = bytes_in_place(bucket, [weight])
    assert view is not None and view.numel() == bucket_offsets(bucket)[1]
    assert view.data_ptr() == weight.data_ptr()  # no copy
    assert torch.equal(unpack(view.clone(), bucket)[0][1], weight)
    # anything that needs converting or compacting is packed instead
    assert bytes_in_place([("w", "bfloat16", [4, 6])], [weight]) is None
    assert bytes_in_place(bucket, [weight.t().contiguous().t()]) is None
    assert bytes_in_place([("w", "float32", [6, 4])], [weight]) is None
    assert bytes_in_place(_entries()[:2], [weight, weight]) is None


def test_offsets_are_aligned_and_do_not_overlap():
    offsets, total = bucket_offsets(_entries())
    ends = [o + entry_nbytes(e) for o, e in zip(offsets, _entries(), strict=True)]
    assert all(o % ALIGN == 0 for o in offsets)
    assert all(end <= nxt for end, nxt in zip(ends, offsets[1:], strict=False))
    assert total == ends[-1]  # no trailing padding: a one-entry bucket is exactly its tensor's bytes
    assert bucket_offsets([("x", "bfloat16", [3, 5])]) == ([0], 30)


def test_pack_unpack_round_trip_converts_dtypes_exactly():
    g = torch.Generator().manual_seed(0)
    entries = _entries()
    tensors = [
        torch.randn(10, 3, generator=g),
        torch.randn(7, generator=g),
        torch.randn(1000, generator=g),
        torch.arange(4).view(2, 2),
        torch.tensor(3.5),
    ]
    buffer = torch.zeros(bucket_offsets(entries)[1], dtype=torch.uint8)
    pack_into(buffer, entries, tensors)
    out = unpack(buffer.clone(), entries)
    for (name, dtype, shape), sent, (got_name, got) in zip(entries, tensors, out, strict=True):
        assert got_name == name and got.dtype == str_to_dtype(dtype) and list(got.shape) == shape
        assert torch.equal(got, sent.to(got.dtype))


def test_shape_mismatch_and_unknown_dtype_are_clear_errors():
    with pytest.raises(ValueError, match=r"weight a: shape \[3\] differs from the announced \[10, 3\]"):
        pack_into(torch.zeros(1024, dtype=torch.uint8), _entries()[:1], [torch.zeros(3)])
    with pytest.raises(ValueError, match="unknown dtype 'float99'"):
        str_to_dtype("float99")
