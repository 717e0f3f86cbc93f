"""sr1's own admission and batch assembly, run inside a simulation: the real `PromptFeeder.pump` against an
in-memory stand-in for the buffer counters it reads, and the real `BatchAssembler._select` through one thin adapter
(`choose_batch`). No Redis: `simulate.py` keeps the groups, these keep the decisions sr1's code makes about them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

from buffer.admission import BatchAssembler
from buffer.records import PromptRecord
from buffer.staleness import StalenessSchedule
from sr1.plan.pipeline import Pipeline
from sr1.plan.trajectories import Group


class EndlessPrompts(Sequence):
    """An endless prompt dataset for the real PromptFeeder."""

    def __len__(self) -> int:
        return 10**12

    def __getitem__(self, i):
        return PromptRecord(f"plan/train/{i}/e0", "", [], [], "plan", i)


class CountingBuffer:
    """The buffer operations `PromptFeeder.pump` calls, kept in memory (no Redis in a simulation)."""

    def __init__(self) -> None:
        self.current_version = 0
        self.dropped = 0
        self.released: list[PromptRecord] = []

    def version(self) -> int:
        return self.current_version

    def replaced_count(self) -> int:
        """Groups that left without being trained (here: dropped by dynamic sampling; nothing is dead-lettered in a
        simulation), each leaving room for one more release."""
        return self.dropped

    def released_count(self) -> int:
        return len(self.released)

    def release_prompts(self, prompts: list[PromptRecord], positions=None) -> list[PromptRecord]:
        self.released += prompts
        return prompts

    def release_pause_reason(self) -> None:
        """No Redis memory to run out of in a simulation: releases never pause for it."""
        return None


@dataclass
class _Taken:
    entry_id: str
    group: Group


def choose_batch(version: int, held: list[Group], unconsumed: dict[str, int], pipe: Pipeline) -> list | None:
    """The batch for `version`, chosen by `BatchAssembler._select` itself (thin adapter: `_select` reads only
    `_held`, `schedule` and `groups_per_step` of its assembler, none of the Redis state)."""
    assembler = SimpleNamespace(
        _held={g.group_id: _Taken(g.group_id, g) for g in held},
        schedule=StalenessSchedule(pipe.max_staleness),
        groups_per_step=pipe.groups_per_step,
    )
    chosen = BatchAssembler._select(assembler, version, unconsumed)
    return None if chosen is None else [t.group for t in chosen]
