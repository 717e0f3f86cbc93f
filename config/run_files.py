"""The config files a run writes: the resolved config and each process's job, owner-only, their secrets masked.

    save_config(cfg, run_dir)                             # <run_dir>/config.yaml (loadable again as a preset path)
    save_job(job, run_dir / "jobs" / "learner.yaml")      # what a launcher hands to the process it starts

Secrets (`common/secrets.py`) are written as `***`; a launcher gives each process what its job file masks in its
environment (`config/secret_env.py`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from pydantic import BaseModel

from common.secrets import mask_config

if TYPE_CHECKING:
    from config.schema import Config


def config_to_yaml(cfg: BaseModel) -> str:
    """`cfg` as YAML with its secrets masked: what is written or shown."""
    return yaml.safe_dump(mask_config(cfg.model_dump(mode="json")), sort_keys=False)


def write_private(path: Path, text: str) -> Path:
    """Write `text` to `path` readable by its owner only (0600), atomically (a temporary file, then a rename): the
    file may hold a secret (the URL of a Redis the run started) and is never readable by others, not even for a
    moment."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a temporary file left over by a crash may have been made more open
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    temp.replace(path)
    return path


def save_config(cfg: Config, run_dir: Path) -> Path:
    """Write the resolved config to `<run_dir>/config.yaml` (loadable again as a preset path), owner-only, its
    secrets masked (a resume gives them again: docs/reliability.md, "Resuming a run whose secrets you gave")."""
    return write_private(run_dir / "config.yaml", config_to_yaml(cfg))


def save_job(job: BaseModel, path: Path) -> Path:
    """Write a process's job config (what a launcher hands to the process it starts), owner-only, its secrets
    masked: the launcher gives them to the process in its environment (`secret_env`, config/secret_env.py)."""
    return write_private(path, config_to_yaml(job))
