"""Synthetic prompts and groups of realistic shape, for tests, the benchmark and dry runs of other parts.

prompt = make_prompt(7)                               # group_id "synthetic/train/7/e0"
group = make_group(prompt, n=5, response_len=1500, version=3)
"""

from __future__ import annotations

import time

import numpy as np

from buffer.records import Group, PromptRecord, Trajectory, make_group_id


def make_prompt(index: int, *, data_source: str = "synthetic", split: str = "train", epoch: int = 0,
                release_version: int = 0) -> PromptRecord:  # fmt: skip
    question = f"who founded company number {index}?"
    return PromptRecord(
        group_id=make_group_id(data_source, split, index, epoch),
        question=question,
        prompt=[{"role": "user", "content": question}],
        ground_truth=[f"founder {index}"],
        data_source=data_source,
        index=index,
        split=split,
        release_version=release_version,
    )


def make_trajectory(rng: np.random.Generator, *, prompt_len: int, response_len: int, version: int,
                    info_every: int = 300) -> Trajectory:  # fmt: skip
    """Sampled tokens at `version`, with an observation block (mask 0, version -1) every `info_every` tokens."""
    mask = np.ones(response_len, dtype=np.uint8)
    for start in range(info_every // 2, response_len, info_every):
        mask[start : start + info_every // 3] = 0
    versions = np.where(mask == 1, version, -1).astype(np.int32)
    logprobs = np.where(mask == 1, -rng.random(response_len, dtype=np.float32), 0).astype(np.float32)
    return Trajectory(
        prompt_ids=rng.integers(0, 32_000, prompt_len, dtype=np.int32),
        response_ids=rng.integers(0, 32_000, response_len, dtype=np.int32),
        loss_mask=mask,
        behavior_logprobs=logprobs,
        versions=versions,
        reward=float(rng.integers(0, 2)),
        info={"em": 0.0, "num_searches": int(response_len // info_every), "finish_reason": "stop"},
    )


def make_group(prompt: PromptRecord, *, n: int = 5, prompt_len: int = 200, response_len: int = 1300,
               version: int | None = None, worker_id: str = "synthetic", seed: int | None = None) -> Group:  # fmt: skip
    """A group of `n` trajectories for `prompt`; tokens sampled at `version` (default: its release_version)."""
    rng = np.random.default_rng(prompt.index if seed is None else seed)
    version = prompt.release_version if version is None else version
    return Group(
        group_id=prompt.group_id,
        data_source=prompt.data_source,
        index=prompt.index,
        trajectories=[
            make_trajectory(rng, prompt_len=prompt_len, response_len=response_len, version=version)
            for _ in range(n)
        ],
        ground_truth=list(prompt.ground_truth),
        question=prompt.question,
        worker_id=worker_id,
        created_at=time.time(),
        release_version=prompt.release_version,
    )
