"""Checkpoints: an HF directory transformers and vLLM load directly, plus the state to resume the run.

    <run_dir>/checkpoints/step_<N>/
        model.safetensors | model-0000k-of-0000n.safetensors + model.safetensors.index.json
        config.json, generation_config.json, tokenizer files          (copied from the model directory)
        resume/dcp/        torch.distributed.checkpoint: each rank writes its own shards of the fp32 parameters and
                           AdamW state (no gather; reloads under another world size too), and PPO's critic's
        resume/rng_rank<r>.pt   each rank's torch RNG state and learning-rate schedules
        resume/state.json  version, data cursor, groups used since the previous checkpoint (acked at resume)
    <run_dir>/checkpoints/latest      name of the newest complete checkpoint (written last, atomically)

The safetensors files are streamed: their header is computed from the global shapes (a DTensor knows them
without gathering), then one parameter at a time is gathered (`full_tensor()`, a collective on every rank) and
rank 0 appends its bytes. At most one full parameter is alive at a time, never the whole model on one device:
the save-time OOM Search-R1 users hit with FSDP1's full state dict.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from learner.distributed import World
from learner.model import DTYPES, full_tensor, named_weights

log = logging.getLogger(__name__)

SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
MAX_SHARD_BYTES = 5 * 2**30
LATEST = "latest"
_HF_FILES_SKIP = {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"}


@dataclass
class ResumeState:
    version: int
    cursor: int = 0  # prompts the feeder has taken from the dataset
    used_group_entries: list[str] = field(
        default_factory=list
    )  # groups in steps since the previous checkpoint
    consumed_groups: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _barrier(world: World) -> None:
    if world.world_size > 1:
        dist.barrier()


def _plan_shards(entries: list[tuple[str, torch.Size, torch.dtype]], max_bytes: int) -> list[list[int]]:
    shards: list[list[int]] = [[]]
    size = 0
    for i, (_, shape, dtype) in enumerate(entries):
        nbytes = shape.numel() * dtype.itemsize
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(i)
        size += nbytes
    return shards


def _header(entries: list[tuple[str, torch.Size, torch.dtype]]) -> bytes:
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


def save_hf_weights(
    model: torch.nn.Module,
    out_dir: Path,
    world: World,
    dtype: torch.dtype,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> None:
    """Stream the model's full weights into safetensors files (collective: call on every rank)."""
    named = list(named_weights(model, skip_tied=True))  # sharded tensors: no memory beyond the shards
    entries = [(name, tensor.shape, dtype) for name, tensor in named]
    shards = _plan_shards(entries, max_shard_bytes)
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    )
    for shard, filename in zip(shards, names, strict=True):
        with open(out_dir / filename, "wb") if world.is_main else contextlib.nullcontext() as handle:
            if handle is not None:
                handle.write(_header([entries[i] for i in shard]))
            for i in shard:
                tensor = full_tensor(named[i][1].detach())  # every rank joins the gather
                if handle is not None:
                    data = tensor.to(device="cpu", dtype=dtype).contiguous()
                    handle.write(data.view(torch.uint8).numpy().tobytes())
                del tensor
            if handle is not None:
                handle.flush()
                os.fsync(handle.fileno())
    if world.is_main and len(shards) > 1:
        weight_map = {entries[i][0]: names[k] for k, shard in enumerate(shards) for i in shard}
        total = sum(shape.numel() * dt.itemsize for _, shape, dt in entries)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _copy_hf_files(
    model_dir: Path, out_dir: Path, dtype_name: str, tokenizer_dir: Path | None = None
) -> None:
    """config.json (dtype set to the saved one), generation config and tokenizer files from the model dir (the
    tokenizer's from `tokenizer_dir` when the model has its tokenizer elsewhere), so a checkpoint loads alone."""
    for source in (model_dir, tokenizer_dir) if tokenizer_dir is not None else (model_dir,):
        for path in source.iterdir():
            if path.is_file() and path.name not in _HF_FILES_SKIP and not path.name.endswith(".safetensors"):
                if source == tokenizer_dir and path.name in ("config.json", "generation_config.json"):
                    continue  # the model's own
                shutil.copy2(path, out_dir / path.name)
    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["torch_dtype"] = dtype_name
    config.pop("dtype", None)
    config["dtype"] = dtype_name
    config_path.write_text(json.dumps(config, indent=2))


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under `root` (what its `latest` pointer names), or None."""
    pointer = Path(root) / LATEST
    if not pointer.is_file():
        return None
    path = Path(root) / pointer.read_text().strip()
    return path if (path / "resume" / "state.json").is_file() else None


class Checkpointer:
    def __init__(
        self,
        root: Path,
        world: World,
        model_dir: Path,
        save_dtype: str = "float32",
        keep: int = 2,
        tokenizer_dir: Path | None = None,
    ):
        self.root = Path(root)
        self.world = world
        self.model_dir = Path(model_dir)
        self.tokenizer_dir = None if tokenizer_dir is None else Path(tokenizer_dir)
        self.save_dtype = save_dtype
        self.keep = keep

    def latest(self) -> Path | None:
        return latest_checkpoint(self.root)

    def save(self, model, optimizer, scheduler, state: ResumeState, critic=None) -> Path:
        """Every rank calls this. Returns the checkpoint directory (complete once `latest` names it). `critic`
        (learner/critic.py) is saved with the policy's resume state."""
        from torch.distributed.checkpoint import save as dcp_save
        from torch.distributed.checkpoint.state_dict import get_state_dict

        world = self.world
        out = self.root / f"step_{state.version}"
        if world.is_main:
            if out.exists():
                shutil.rmtree(out)  # a half-written directory from a crash during a save
            (out / "resume").mkdir(parents=True)
        _barrier(world)
        # 1. HF weights, streamed parameter by parameter
        save_hf_weights(model, out, world, DTYPES[self.save_dtype])
        if world.is_main:
            _copy_hf_files(self.model_dir, out, self.save_dtype, self.tokenizer_dir)
        # 2. sharded fp32 parameters + optimizer state, each rank its own shards
        model_sd, optim_sd = get_state_dict(model, optimizer)
        sharded = {"model": model_sd, "optim": optim_sd}
        local = {"torch": torch.get_rng_state(), "scheduler": scheduler.state_dict()}
        if critic is not None:
            sharded["critic_model"], sharded["critic_optim"] = get_state_dict(critic.model, critic.optimizer)
            local["critic_scheduler"] = critic.scheduler.state_dict()
        dcp_save(sharded, checkpoint_id=str(out / "resume" / "dcp"))
        torch.save(local, out / "resume" / f"rng_rank{world.rank}.pt")
        _barrier(world)
        # 3. the resume state and the `latest` pointer, written last (a crash before this leaves the old latest)
        if world.is_main:
            body = json.dumps(state.__dict__, indent=2)
            _atomic_write(out / "resume" / "state.json", body)
            _atomic_write(self.root / LATEST, out.name)
            self._prune(out)
        _barrier(world)
        return out

    def load(self, path: Path, model, optimizer, scheduler, critic=None) -> ResumeState:
        """Restore model shards, optimizer, scheduler and RNG from `path` (every rank), and the critic's."""
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint import load as dcp_load
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_sd, optim_sd = get_state_dict(model, optimizer)
        target = {"model": model_sd, "optim": optim_sd}
        if critic is not None:
            saved = FileSystemReader(str(path / "resume" / "dcp")).read_metadata().state_dict_metadata
            if not any(key.startswith("critic_model.") for key in saved):
                raise ValueError(
                    f"{path} holds no critic (saved by a run without PPO's value model); resume it with the algorithm "
                    "it was trained with, or start a new run"
                )
            target["critic_model"], target["critic_optim"] = get_state_dict(critic.model, critic.optimizer)
        dcp_load(target, checkpoint_id=str(path / "resume" / "dcp"))
        set_state_dict(model, optimizer, model_state_dict=target["model"], optim_state_dict=target["optim"])
        if critic is not None:
            set_state_dict(
                critic.model,
                critic.optimizer,
                model_state_dict=target["critic_model"],
                optim_state_dict=target["critic_optim"],
            )
        rng_path = path / "resume" / f"rng_rank{self.world.rank}.pt"
        if not rng_path.is_file():
            rng_path = path / "resume" / "rng_rank0.pt"  # resumed under a larger world
        extra = torch.load(rng_path, weights_only=False)
        torch.set_rng_state(extra["torch"])
        scheduler.load_state_dict(extra["scheduler"])
        if critic is not None:
            critic.scheduler.load_state_dict(extra["critic_scheduler"])
        return ResumeState(**json.loads((path / "resume" / "state.json").read_text()))

    def _prune(self, newest: Path) -> None:
        steps = sorted(
            (p for p in self.root.glob("step_*") if p.is_dir() and p.name.split("_")[1].isdigit()),
            key=lambda p: int(p.name.split("_")[1]),
        )
        for old in steps[: -self.keep]:
            if old != newest:
                shutil.rmtree(old, ignore_errors=True)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
