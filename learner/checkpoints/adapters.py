"""The LoRA side of a checkpoint (learner/checkpoints/checkpointer.py calls these): the adapter in PEFT's layout, the
merged model in the final checkpoint, and the DCP resume state of the adapters and their optimizer state only.

    <checkpoint>/adapter/adapter_config.json, adapter_model.safetensors   every LoRA checkpoint (fp32 adapters)
    <checkpoint>/model.safetensors, config.json, tokenizer files           the final one: base + alpha/r B A merged
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from learner.checkpoints.files import WriteBudget, write_durably
from learner.checkpoints.hf_weights import save_hf_weights
from learner.distributed import World
from learner.lora import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    adapter_config,
    adapter_weights,
    full,
    merged_entries,
)
from learner.model import tied_names
from learner.settings import LoraSettings

ADAPTER_DIR = "adapter"  # vLLM's --lora-modules and PEFT's from_pretrained load it


def save_weights(
    model: torch.nn.Module,
    out_dir: Path,
    world: World,
    settings: LoraSettings | None,
    base_model: Path,
    dtype: torch.dtype,
    budget: WriteBudget | None,
    export: bool,
) -> OSError | None:
    """A checkpoint's weights (collective: every rank): without LoRA the model's HF weights in `dtype`; with it the
    adapter under `out_dir/adapter` and, when `export`, the merged model's HF weights. Returns rank 0's write error,
    None elsewhere."""
    if settings is None:
        return save_hf_weights(model, out_dir, world, dtype, budget=budget)
    error = save_adapter(model, out_dir / ADAPTER_DIR, world.is_main, settings, str(base_model), budget)
    if export:
        weights = merged_entries(model, settings, tied_names(model))
        error = save_hf_weights(model, out_dir, world, dtype, budget=budget, weights=weights) or error
    return error


def check_resumable(path: Path, lora: LoraSettings | None) -> None:
    """A checkpoint resumes only a run of its own kind: ValueError naming both when LoRA meets full weights."""
    saved = (path / ADAPTER_DIR / ADAPTER_CONFIG).is_file()
    if saved != (lora is not None):
        raise ValueError(
            f"{path} was written by a {'LoRA' if saved else 'full-weight'} run and this one "
            f"{'trains LoRA adapters' if lora is not None else 'trains every weight'}: resume it with the "
            "learner.lora it was trained with, or start a new run"
        )


def state_dict_options(lora: LoraSettings | None):
    """DCP's view of the policy: with LoRA the adapters only (the frozen base is the model directory's)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=lora is not None, strict=lora is None)


def save_adapter(
    model: torch.nn.Module,
    out_dir: Path,
    is_main: bool,
    settings: LoraSettings,
    base_model: str = "",
    budget: WriteBudget | None = None,
) -> OSError | None:
    """Write the adapter in PEFT's layout (`adapter_config.json`, `adapter_model.safetensors` in fp32), loadable by
    `PeftModel.from_pretrained` and vLLM's `--lora-modules`. Collective (every rank joins each gather; the adapters
    are small, so rank 0 holds them all at once); returns rank 0's write error, None elsewhere."""
    from safetensors.torch import save as safetensors_bytes

    tensors = {
        name: full(t.detach()).to("cpu", torch.float32).contiguous() for name, t in adapter_weights(model)
    }
    if not is_main:
        return None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_durably(
            out_dir / ADAPTER_WEIGHTS, safetensors_bytes(tensors, metadata={"format": "pt"}), budget
        )
        config = json.dumps(adapter_config(settings, base_model), indent=2).encode()
        write_durably(out_dir / ADAPTER_CONFIG, config, budget)
    except OSError as err:
        return err
    return None
