"""The `weight_sync` config section: how new weights travel from learner rank 0 to every engine."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class WeightSyncConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="Collective backend: auto = NCCL when CUDA is available, else gloo."
    )
    bucket_mb: float = Field(
        256.0, gt=0, description="Parameters are gathered and broadcast in buckets of this size."
    )
    in_place_mb: float = Field(
        1.0,
        ge=0,
        description="A tensor of at least this size that needs no conversion (already in the wire dtype, or an FSDP "
        "shard gathered in it) is broadcast from its own memory instead of being copied into a bucket (0: copy every "
        "tensor).",
    )
    timeout_s: float = Field(
        300.0,
        gt=0,
        description="A broadcast or rendezvous that does not finish in this time fails with a clear error.",
    )
    master_addr: str = Field(
        "127.0.0.1", description="Address learner rank 0 listens on for the weight-sync store."
    )
    master_port: int | None = Field(
        None, ge=1, le=65535, description="Port of the weight-sync store (None: a free port)."
    )
    keep_receive_buffers: bool = Field(
        True,
        description=(
            "Engines keep their receive buffers (one copy of the weights in the transport dtype) between updates "
            "instead of allocating them per update; the peak memory is the same, page faults are paid once."
        ),
    )
