"""verl FSDP actor checkpoints as HF model directories: the per-rank shards merged into safetensors, once.

    merged = merged_verl_checkpoint(Path("verl_checkpoints/exp/global_step_100/actor"))  # ~/.cache/sr1/verl/<key>

verl's FSDP checkpoint manager saves, per actor, `model_world_size_<W>_rank_<R>.pt` (each rank's sharded state dict:
DTensors sharded along one dimension over the FSDP mesh, or plain tensors that every rank holds whole), the optimizer
and extra state beside them, and `huggingface/` with the model's config and tokenizer. The merge concatenates each
parameter's shards in rank order, checks the result against the global shape the DTensor records, and writes
`model.safetensors` beside a copy of `huggingface/`. The cache key is the checkpoint's path and its shards' sizes and
times, so a checkpoint is merged once however many processes load it (each writes into a temporary directory and
renames it into place; the first rename wins).

The shards are unpickled with `torch.load(weights_only=True)`: tensors, DTensors and their placements and device
mesh (which torch itself allows), nothing else. A full unpickler would run whatever code a file someone hands over
holds; a shard that needs one is refused (`UnsafeCheckpointError`) with how to convert it: verl's own merger
(`python -m verl.model_merger merge --backend fsdp --local_dir <actor> --target_dir <out>`) writes the HF directory
that any model path takes.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

_SHARD = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")


class VerlCheckpointError(ValueError):
    """A verl checkpoint that cannot be merged: a missing shard or `huggingface/`, or shards that do not fit."""


class UnsafeCheckpointError(VerlCheckpointError):
    """A shard whose pickle holds more than tensors, so loading it could run code: refused, not loaded."""


def actor_dir(path: Path) -> Path | None:
    """The directory holding the model shards: `path` itself, or its `actor/` (verl's `global_step_<N>`); None when
    `path` is no verl FSDP checkpoint."""
    for candidate in (path, path / "actor"):
        if candidate.is_dir() and any(_SHARD.match(p.name) for p in candidate.iterdir()):
            return candidate
    return None


def _shards(actor: Path) -> list[Path]:
    sizes = {int(m.group(1)) for p in actor.iterdir() if (m := _SHARD.match(p.name))}
    if len(sizes) != 1:
        raise VerlCheckpointError(f"{actor}: model shards of several world sizes {sorted(sizes)}")
    world_size = sizes.pop()
    shards = [actor / f"model_world_size_{world_size}_rank_{rank}.pt" for rank in range(world_size)]
    missing = [p.name for p in shards if not p.is_file()]
    if missing:
        raise VerlCheckpointError(f"{actor}: world size {world_size} but {', '.join(missing)} missing")
    return shards


def _cache_key(actor: Path, shards: list[Path]) -> str:
    digest = hashlib.sha256(str(actor.resolve()).encode())
    for shard in shards:
        stat = shard.stat()
        digest.update(f"{shard.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    """Where merged checkpoints go: $XDG_CACHE_HOME/sr1/verl, else ~/.cache/sr1/verl."""
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "sr1" / "verl"


def merged_verl_checkpoint(path: Path, cache: Path | None = None) -> Path:
    """The HF directory of the verl actor checkpoint at `path` (merged on first use)."""
    actor = actor_dir(path)
    if actor is None:
        raise VerlCheckpointError(f"{path} holds no model_world_size_<W>_rank_<R>.pt shards")
    hf = actor / "huggingface"
    if not (hf / "config.json").is_file():
        raise VerlCheckpointError(
            f"{actor}: no huggingface/config.json beside the shards (verl saves the model's "
            "config and tokenizer there)"
        )
    shards = _shards(actor)
    target = (cache or cache_root()) / _cache_key(actor, shards)
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".merging-", dir=target.parent))
    try:
        shutil.copytree(hf, staging, dirs_exist_ok=True)
        _write_merged(shards, staging / "model.safetensors")
        try:
            staging.rename(target)
        except OSError:  # another process merged it first
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _write_merged(shards: list[Path], out: Path) -> None:
    from safetensors.torch import save_file

    states = [_load_shard(shard) for shard in shards]
    names = list(states[0])
    for shard, state in zip(shards, states, strict=True):
        if list(state) != names:
            raise VerlCheckpointError(f"{shard.name} holds other parameters than {shards[0].name}")
    merged = {}
    for name in names:
        tensor = _whole([state[name] for state in states], name)
        merged[name] = tensor.contiguous().clone()  # no storage shared between entries (tied weights)
    save_file(merged, str(out), metadata={"format": "pt"})


def _load_shard(shard: Path) -> dict:
    """One rank's state dict, unpickled with torch's weights-only unpickler (tensors and DTensors only)."""
    import pickle

    import torch
    import torch.distributed.tensor  # noqa: F401 - registers DTensor and its placements as safe to unpickle

    try:
        state = torch.load(shard, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL (\S+)", str(err))
        what = f"it names `{found.group(1)}`" if found else str(err).strip().splitlines()[0][:200]
        raise UnsafeCheckpointError(
            f"{shard}: refused: this shard holds Python objects other than tensors ({what}), and unpickling them "
            "could run any code the file carries. If you trust the file, convert the checkpoint with verl's own "
            f"merger (`python -m verl.model_merger merge --backend fsdp --local_dir {shard.parent} --target_dir "
            "<out>`) and pass <out> instead"
        ) from None
    if not isinstance(state, dict):
        raise VerlCheckpointError(f"{shard}: expected a state dict, got {type(state).__name__}")
    return state


def _whole(parts: list, name: str):
    """One parameter from its per-rank values: DTensor shards concatenated along their shard dimension, or the
    value every rank holds whole."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate, Shard

    first = parts[0]
    if not isinstance(first, DTensor):
        if not isinstance(first, torch.Tensor):
            raise VerlCheckpointError(f"{name}: expected tensors, got {type(first).__name__}")
        return first
    placements = first.placements
    if len(placements) != 1:
        raise VerlCheckpointError(
            f"{name}: a {len(placements)}-D device mesh {placements}; only FSDP's 1-D mesh is merged"
        )
    placement = placements[0]
    if isinstance(placement, Replicate):
        return first.to_local()
    if not isinstance(placement, Shard):
        raise VerlCheckpointError(f"{name}: cannot merge a {placement} placement")
    whole = torch.cat([part.to_local() for part in parts], dim=placement.dim)
    if tuple(whole.shape) != tuple(first.shape):
        raise VerlCheckpointError(
            f"{name}: shards give shape {tuple(whole.shape)}, the checkpoint records {tuple(first.shape)}"
        )
    return whole
