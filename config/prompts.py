"""The prompts a process runs on: the task's readers, the files of its `data` section, too-long ones dropped.

    prompts, overlong = fitting_prompts(job, "train", tokenizer)   # a LearnerJob, GeneratorJob or root Config

One call for the learner's feeder (train), the generators' evaluations (test) and the checks before a run starts
(sr1/preflight.py), so all three read and drop the same prompts.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tasks import build_task
from tasks.prompt_tokens import OverlongPrompts, load_fitting_prompts

NO_TRAIN_FILES = "data.train_files is empty: the learner's prompt feeder needs training prompts"


def fitting_prompts(
    cfg: Any, split: str, tokenizer: Any, files: Iterable[Path] | None = None
) -> tuple[list, OverlongPrompts]:
    """The prompts of `cfg.data.<split>_files` (or `files`) that fit in `cfg.model.max_prompt_tokens`, dropped ones
    counted (DataError instead with `data.filter_overlong_prompts` false, or for a file that cannot be read).
    `cfg` is any config with `task`, `model` and `data` sections."""
    return load_fitting_prompts(
        build_task(cfg.task),
        getattr(cfg.data, f"{split}_files") if files is None else files,
        split=split,
        tokenizer=tokenizer,
        max_tokens=cfg.model.max_prompt_tokens,
        chat_template=cfg.model.chat_template,
        drop_overlong=cfg.data.filter_overlong_prompts,
    )
