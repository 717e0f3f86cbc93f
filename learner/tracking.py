"""Metrics: JSONL in `<run_dir>/metrics.jsonl` always, wandb when enabled, nothing on ranks other than 0.

    tracker = Tracker(run_dir, logging_cfg, world.rank, config=resolved_config_dict)
    tracker.log({"loss/total": 0.12, "staleness/max": 2}, step=7)
    tracker.close()

`sr1 run` reads metrics.jsonl for its live view and final report: one JSON object per line with `step`, `time`
and the namespaced keys (`loss/...`, `staleness/...`, `perf/...`, `learner/version`).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def merge_metrics(*parts: dict[str, Any]) -> dict[str, Any]:
    """One row from the metrics of several emitters; a key two emitters both report is a bug, not an overwrite."""
    merged: dict[str, Any] = {}
    for part in parts:
        clash = merged.keys() & part.keys()
        if clash:
            raise ValueError(f"metric keys reported twice in one row: {sorted(clash)}")
        merged.update(part)
    return merged


class Tracker:
    def __init__(self, run_dir: Path | None, logging_cfg=None, rank: int = 0, config: dict | None = None):
        self.active = rank == 0 and run_dir is not None
        self._file = None
        self._wandb = None
        if not self.active:
            return
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        # line-buffered (readers see whole lines); open for the tracker's life, closed in close()
        self._file = open(run_dir / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115
        if logging_cfg is not None and logging_cfg.wandb:
            import wandb

            self._wandb = wandb.init(
                project=logging_cfg.wandb_project,
                mode=logging_cfg.wandb_mode,
                dir=str(run_dir),
                config=config or {},
                name=run_dir.name,
                resume="allow",
            )

    def mark_segment(self, info: dict[str, Any]) -> None:
        """A line `{"segment": info}` where a learner process starts (info: its start version, the checkpoint it
        resumed from, ...): readers of the file drop the rows of steps that a later segment trained again."""
        if self.active:
            self._file.write(json.dumps({"segment": info}) + "\n")

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if not self.active:
            return
        record = {"step": int(step), "time": time.time()} | {k: _plain(v) for k, v in metrics.items()}
        self._file.write(json.dumps(record) + "\n")
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in record.items() if k not in ("step", "time")}, step=int(step))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
