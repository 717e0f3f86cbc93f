"""The records that cross Redis: prompts handed to generators, trajectories and GRPO groups.

A `Trajectory` holds numpy arrays aligned token by token over the response (everything after the prompt):
sampled tokens have `loss_mask=1`, their engine log-prob and the policy version that sampled them; observation
tokens (retrieved `<information>` blocks) have `loss_mask=0`, log-prob 0 and version -1. Nothing is ever stored as
text to be re-tokenized.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# dtype of every array field of a Trajectory, in wire order.
TRAJECTORY_ARRAYS: dict[str, np.dtype] = {
    "prompt_ids": np.dtype(np.int32),
    "response_ids": np.dtype(np.int32),
    "loss_mask": np.dtype(np.uint8),
    "behavior_logprobs": np.dtype(np.float32),
    "versions": np.dtype(np.int32),
}


class RecordError(ValueError):
    """A record whose fields are inconsistent (lengths, dtypes, masks)."""


def make_group_id(data_source: str, split: str, index: int, epoch: int = 0) -> str:
    """A group id unique across datasets and epochs (Search-R1 keyed groups by index alone, merging datasets)."""
    return f"{data_source}/{split}/{index}/e{epoch}"


@dataclass
class PromptRecord:
    """One question released to the generators; its `group_size` samples form one `Group`."""

    group_id: str
    question: str
    prompt: list[dict[str, str]]  # chat messages, Search-R1 layout: [{"role": "user", "content": ...}]
    ground_truth: list[str]
    data_source: str
    index: int
    split: str = "train"
    release_version: int = (
        0  # learner version when the feeder released it (admission control, staleness bound)
    )

    def to_dict(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "question": self.question,
            "prompt": self.prompt,
            "ground_truth": list(self.ground_truth),
            "data_source": self.data_source,
            "index": int(self.index),
            "split": self.split,
            "release_version": int(self.release_version),
        }

    def in_epoch(self, epoch: int) -> PromptRecord:
        """This prompt on another pass over the data: its group id names the epoch (a `/dupK` suffix is kept)."""
        base = make_group_id(self.data_source, self.split, self.index, 0)
        suffix = self.group_id[len(base) :] if self.group_id.startswith(base) else ""
        group_id = make_group_id(self.data_source, self.split, self.index, epoch) + suffix
        return dataclasses.replace(self, group_id=group_id)


# why a trajectory ended (`info["finish_reason"]`): it answered, the model stopped, the tool-call limit, the token
# budget, or the generator aborted it
FINISH_REASONS = ("answer", "eos", "max_turns", "budget", "abort")


@dataclass
class Trajectory:
    prompt_ids: np.ndarray
    response_ids: np.ndarray
    loss_mask: np.ndarray
    behavior_logprobs: np.ndarray
    versions: np.ndarray
    reward: float
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, dtype in TRAJECTORY_ARRAYS.items():
            setattr(self, name, np.ascontiguousarray(getattr(self, name), dtype=dtype))

    def validate(self) -> None:
        """Raise RecordError if the arrays do not line up as described above (module docstring)."""
        n = len(self.response_ids)
        for name in ("loss_mask", "behavior_logprobs", "versions"):
            got = len(getattr(self, name))
            if got != n:
                raise RecordError(f"{name} has {got} entries but response_ids has {n}")
        if len(self.prompt_ids) == 0:
            raise RecordError("prompt_ids is empty")
        mask = self.loss_mask
        if mask.size and mask.max(initial=0) > 1:
            raise RecordError("loss_mask must contain only 0 and 1")
        masked = mask == 0
        if np.any(self.versions[masked] != -1):
            raise RecordError("versions must be -1 where loss_mask is 0 (observation tokens)")
        if np.any(self.versions[~masked] < 0):
            raise RecordError("versions must be >= 0 where loss_mask is 1 (sampled tokens)")
        if not np.all(np.isfinite(self.behavior_logprobs)):
            raise RecordError("behavior_logprobs contains NaN or inf")
        if not np.isfinite(self.reward):
            raise RecordError(f"reward must be finite, got {self.reward}")

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())

    def sampled_versions(self) -> np.ndarray:
        return self.versions[self.loss_mask == 1]


@dataclass
class Group:
    """The n samples of one prompt (one GRPO group)."""

    group_id: str
    data_source: str
    index: int
    trajectories: list[Trajectory]
    ground_truth: list[str] = field(default_factory=list)
    question: str = ""
    worker_id: str = ""
    created_at: float = 0.0
    release_version: int = 0  # copied from the PromptRecord: the learner version when the prompt was released

    def validate(self) -> None:
        if not self.group_id:
            raise RecordError("group_id is empty")
        if not self.trajectories:
            raise RecordError(f"group {self.group_id} has no trajectories")
        for i, trajectory in enumerate(self.trajectories):
            try:
                trajectory.validate()
            except RecordError as err:
                raise RecordError(f"group {self.group_id}, trajectory {i}: {err}") from None

    @property
    def rewards(self) -> np.ndarray:
        return np.array([t.reward for t in self.trajectories], dtype=np.float64)

    def min_version(self) -> int | None:
        """The oldest policy version that sampled any token of this group (None if nothing was sampled)."""
        versions = [t.sampled_versions() for t in self.trajectories]
        versions = [v for v in versions if v.size]
        return int(min(v.min() for v in versions)) if versions else None

    def max_version(self) -> int | None:
        versions = [t.sampled_versions() for t in self.trajectories]
        versions = [v for v in versions if v.size]
        return int(max(v.max() for v in versions)) if versions else None
