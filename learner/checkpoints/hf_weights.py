"""The Hugging Face half of a checkpoint: safetensors weights that transformers and vLLM load directly, and the
model's config, generation config and tokenizer files beside them.

    error = save_hf_weights(model, out_dir, world, torch.bfloat16, budget=budget)   # every rank (collective)
    copy_hf_files(model_dir, out_dir, "bfloat16", tokenizer_dir, budget)           # rank 0

The safetensors files are streamed: their header is computed from the global shapes (a DTensor knows them
without gathering), then one parameter at a time is gathered (`full_tensor()`, a collective on every rank) and
rank 0 appends its bytes. At most one full parameter is alive at a time, never the whole model on one device:
the save-time OOM Search-R1 users hit with FSDP1's full state dict.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from learner.checkpoints.files import WriteBudget, write_durably
from learner.distributed import World
from learner.model import full_tensor, named_weights

SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
MAX_SHARD_BYTES = 5 * 2**30
INDEX = "model.safetensors.index.json"
_HF_FILES_SKIP = {"model.safetensors", INDEX, "pytorch_model.bin"}

Entry = tuple[str, torch.Size, torch.dtype]


def _nbytes(entry: Entry) -> int:
    return entry[1].numel() * entry[2].itemsize


def _plan_shards(entries: list[Entry], max_bytes: int) -> list[list[int]]:
    shards: list[list[int]] = [[]]
    size = 0
    for i, entry in enumerate(entries):
        if shards[-1] and size + _nbytes(entry) > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(i)
        size += _nbytes(entry)
    return shards


def _header(entries: list[Entry]) -> bytes:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, dtype in entries:
        nbytes = shape.numel() * dtype.itemsize
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw


def hf_weight_bytes(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """The bytes of the safetensors weights `save_hf_weights` writes (without headers)."""
    return sum(t.shape.numel() * dtype.itemsize for _, t in named_weights(model, skip_tied=True))


def save_hf_weights(
    model: torch.nn.Module,
    out_dir: Path,
    world: World,
    dtype: torch.dtype,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    budget: WriteBudget | None = None,
    weights: list[tuple[str, torch.Size, Callable[[], torch.Tensor]]] | None = None,
) -> OSError | None:
    """Stream the model's full weights into safetensors files (collective: call on every rank). Returns rank 0's
    write error (None on success and on the other ranks): after one, rank 0 writes nothing more but goes on taking
    part in every gather, so that no rank waits for it in a collective. Each file is fsynced and its size checked
    against its plan. `weights`: (HF name, global shape, gather) to write instead of the model's own parameters
    (a LoRA model's merged weights, learner/lora.py's `merged_entries`)."""
    budget = budget or WriteBudget()
    if weights is None:  # sharded tensors: no memory beyond the shards
        weights = [
            (name, tensor.shape, lambda t=tensor: full_tensor(t.detach()))
            for name, tensor in named_weights(model, skip_tied=True)
        ]
    entries = [(name, shape, dtype) for name, shape, _ in weights]
    shards = _plan_shards(entries, max_shard_bytes)
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    )
    error: OSError | None = None
    for shard, filename in zip(shards, names, strict=True):
        path = out_dir / filename
        handle = None
        if world.is_main and error is None:
            try:
                handle = open(path, "wb")  # noqa: SIM115 - closed below, after every gather of the shard
                header = _header([entries[i] for i in shard])
                budget.write(handle, header, path)
            except OSError as err:
                error = err
        for i in shard:
            tensor = weights[i][2]()  # every rank joins the gather
            if handle is not None and error is None:
                data = tensor.to(device="cpu", dtype=dtype).contiguous()
                try:
                    budget.write(handle, data.view(torch.uint8).numpy().reshape(-1).data, path)
                except OSError as err:
                    error = err
            del tensor
        if handle is not None:
            try:
                if error is None:
                    handle.flush()
                    os.fsync(handle.fileno())
            except OSError as err:
                error = err
            finally:
                handle.close()
            planned = len(header) + sum(_nbytes(entries[i]) for i in shard)
            if error is None and path.stat().st_size != planned:
                error = OSError(f"{path} has {path.stat().st_size} bytes after writing, {planned} planned")
    if world.is_main and error is None and len(shards) > 1:
        weight_map = {entries[i][0]: names[k] for k, shard in enumerate(shards) for i in shard}
        index = {"metadata": {"total_size": sum(_nbytes(e) for e in entries)}, "weight_map": weight_map}
        try:
            write_durably(out_dir / INDEX, json.dumps(index, indent=2).encode(), budget)
        except OSError as err:
            error = err
    return error


def copy_hf_files(
    model_dir: Path,
    out_dir: Path,
    dtype_name: str,
    tokenizer_dir: Path | None = None,
    budget: WriteBudget | None = None,
) -> None:
    """config.json (dtype set to the saved one), generation config and tokenizer files from the model dir (the
    tokenizer's from `tokenizer_dir` when the model has its tokenizer elsewhere), so a checkpoint loads alone.
    Each file is fsynced."""
    files: dict[str, Path] = {}
    for source in (model_dir, tokenizer_dir) if tokenizer_dir is not None else (model_dir,):
        for path in source.iterdir():
            if path.is_file() and path.name not in _HF_FILES_SKIP and not path.name.endswith(".safetensors"):
                if source == tokenizer_dir and path.name in ("config.json", "generation_config.json"):
                    continue  # the model's own
                files[path.name] = path
    for name, path in files.items():
        data = path.read_bytes()
        if name == "config.json":
            config = json.loads(data)
            config["torch_dtype"] = dtype_name
            config["dtype"] = dtype_name
            data = json.dumps(config, indent=2).encode()
        write_durably(out_dir / name, data, budget)
