"""The publisher gathers FSDP shards in the wire dtype: cast shard by shard, then all-gather (half the bytes for
a bf16 publish of fp32 weights), with the values of casting after the gather."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from weight_sync.publisher import gather_for_wire


@pytest.fixture
def mesh(free_port):
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_dtensors_are_cast_before_the_gather_and_plain_tensors_pass_through(mesh, monkeypatch):
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    weight = torch.randn(6, 4)
    sharded = distribute_tensor(weight, mesh, [Shard(0)])
    gathered_dtypes: list[torch.dtype] = []
    original = DTensor.full_tensor

    def spy(self, *args, **kwargs):
        gathered_dtypes.append(self.dtype)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DTensor, "full_tensor", spy)
    wire = gather_for_wire(sharded, torch.bfloat16)
    assert gathered_dtypes == [torch.bfloat16]  # the all-gather moved bf16, not fp32
    assert wire.dtype == torch.bfloat16 and torch.equal(wire, weight.to(torch.bfloat16))
    same = gather_for_wire(sharded, None)
    assert gathered_dtypes[-1] == torch.float32 and torch.equal(same, weight)
    plain = torch.randn(3)
    assert gather_for_wire(plain, torch.bfloat16) is plain  # packing converts plain tensors
