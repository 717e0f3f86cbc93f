"""Synthetic prompts and groups, for the tests and the benchmarks in scripts/.

    prompt = make_prompt(7)                               # group_id "synthetic/train/7/e0"
    group = make_group(prompt, n=5, response_len=1500, version=3)      # realistic shape (buffer benchmark)
    groups = random_groups(np.random.default_rng(0), n_groups=4, group_size=4, version=3, vocab_size=500)
    prompts = toy_prompts(100)                            # PromptRecords for a prompt feeder

Responses contain observation blocks (loss_mask 0, version -1), as search trajectories do.
"""

from __future__ import annotations

import time

import numpy as np

from buffer.records import Group, PromptRecord, Trajectory, make_group_id


def make_prompt(
    index: int,
    *,
    data_source: str = "synthetic",
    split: str = "train",
    epoch: int = 0,
    release_version: int = 0,
) -> PromptRecord:
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


def make_trajectory(
    rng: np.random.Generator, *, prompt_len: int, response_len: int, version: int, info_every: int = 300
) -> Trajectory:
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
        info={"em": 0.0, "tool_calls": int(response_len // info_every), "finish_reason": "stop"},
    )


def make_group(
    prompt: PromptRecord,
    *,
    n: int = 5,
    prompt_len: int = 200,
    response_len: int = 1300,
    version: int | None = None,
    worker_id: str = "synthetic",
    seed: int | None = None,
) -> Group:
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


def random_trajectory(
    rng: np.random.Generator,
    *,
    prompt_len: int,
    response_len: int,
    version: int,
    vocab_size: int,
    reward: float,
    observation: bool = True,
) -> Trajectory:
    mask = np.ones(response_len, dtype=np.uint8)
    if observation and response_len >= 6:
        start = int(rng.integers(1, response_len - 4))
        mask[start : start + 3] = 0
    return Trajectory(
        prompt_ids=rng.integers(0, vocab_size, prompt_len),
        response_ids=rng.integers(0, vocab_size, response_len),
        loss_mask=mask,
        behavior_logprobs=np.where(mask == 1, rng.uniform(-8.0, -4.0, response_len), 0.0),
        versions=np.where(mask == 1, version, -1),
        reward=reward,
    )


def random_groups(
    rng: np.random.Generator,
    *,
    n_groups: int,
    group_size: int,
    version: int = 0,
    vocab_size: int = 500,
    prompt_len: tuple[int, int] = (4, 12),
    response_len: tuple[int, int] = (4, 40),
    start_index: int = 0,
) -> list[Group]:
    """Groups with lengths uniform in the given [low, high) ranges and 0/1 rewards."""
    groups = []
    for g in range(n_groups):
        trajectories = [
            random_trajectory(
                rng,
                prompt_len=int(rng.integers(*prompt_len)),
                response_len=int(rng.integers(*response_len)),
                version=version,
                vocab_size=vocab_size,
                reward=float(rng.integers(0, 2)),
            )
            for _ in range(group_size)
        ]
        index = start_index + g
        groups.append(Group(f"toy/train/{index}/e0", "toy", index, trajectories, release_version=version))
    return groups


def toy_prompts(n: int, data_source: str = "toy"):
    """PromptRecords for the feeder (the toy generator ignores their text)."""
    from buffer.records import PromptRecord, make_group_id

    return [
        PromptRecord(
            group_id=make_group_id(data_source, "train", i),
            question=f"toy question {i}",
            prompt=[{"role": "user", "content": f"toy question {i}"}],
            ground_truth=["x"],
            data_source=data_source,
            index=i,
        )
        for i in range(n)
    ]


def groups_with_rewards(rewards: list[list[float]], *, version: int = 0) -> list[Group]:
    """One small group per list of rewards (one trajectory per reward), for advantage tests."""
    rng = np.random.default_rng(0)
    return [
        Group(
            f"toy/train/{g}/e0",
            "toy",
            g,
            [
                random_trajectory(rng, prompt_len=4, response_len=6, version=version, vocab_size=50, reward=r)
                for r in group_rewards
            ],
            release_version=version,
        )
        for g, group_rewards in enumerate(rewards)
    ]
