"""Model paths as Search-R1's scripts give them: a local directory, or a hub id found in the local Hugging Face cache.

    resolve_model_path("Qwen/Qwen2.5-3B-Instruct")    # -> ~/.cache/huggingface/hub/models--Qwen--.../snapshots/<sha>
    resolve_model_path("runs/x/checkpoints/step_40")  # a directory is taken as it is
    resolve_model_path("verl_checkpoints/x/global_step_100")  # a verl FSDP checkpoint: merged into an HF directory

Nothing is downloaded: a hub id must already be in the cache (`huggingface-cli download ID`, or `HF_HOME` /
`HF_HUB_CACHE` pointing at a cache that holds it). Every process that loads the model or the tokenizer resolves the
configured name itself, so pools launched separately accept the same config.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from common.verl_checkpoint import VerlCheckpointError, actor_dir, merged_verl_checkpoint

if TYPE_CHECKING:
    from common.sections import ModelConfig

# `org/name` (the hub's repo id shape); anything else that is not a directory is a typo, not a hub id
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelPathError(ValueError):
    """A model or tokenizer path that is neither a directory nor a cached hub id; says where it looked."""


def resolve_model_path(
    name: str | Path, *, what: str = "model.path", cache_dir: str | Path | None = None
) -> Path:
    """The local directory of `name`: the directory itself, the cached snapshot of the hub id `name`, or the HF
    directory merged from the verl FSDP checkpoint `name` (`common/verl_checkpoint.py`)."""
    path = Path(name).expanduser()
    if path.is_dir():
        if actor_dir(path) is None:
            return path
        try:
            return merged_verl_checkpoint(path)
        except VerlCheckpointError as err:
            raise ModelPathError(f"{what} {str(name)!r}: {err}") from None
    text = str(name)
    if text in ("tiny", "tiny-qwen2.5"):
        raise ModelPathError(f"{what} {text!r} is an embedded model: only `sr1 run` builds and resolves it")
    if not _HUB_ID.match(text) or path.exists():
        raise ModelPathError(
            f"{what} {text!r} is not a directory (expected an HF model directory or a hub id "
            "such as Qwen/Qwen2.5-3B-Instruct)"
        )
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = Path(cache_dir) if cache_dir is not None else Path(constants.HF_HUB_CACHE)
    try:
        return Path(snapshot_download(text, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError:
        raise ModelPathError(
            f"{what} {text!r} is not a directory and not in the Hugging Face cache at {cache}; download it first "
            f"(`huggingface-cli download {text}`) or point HF_HOME / HF_HUB_CACHE at the cache that holds it"
        ) from None


def resolve_tokenizer_path(model: ModelConfig) -> Path:
    """The local directory of the model's tokenizer: `model.tokenizer_path` when given, else `model.path`."""
    if model.tokenizer_path:
        return resolve_model_path(model.tokenizer_path, what="model.tokenizer_path")
    return resolve_model_path(model.path)
