"""sr1's own admission and batch assembly, run inside a simulation: the real `PromptFeeder.pump` against an
in-memory stand-in for the buffer counters it reads, and the assembler's own choice, `buffer.admission.select_batch`
(a pure function, `choose_batch`). No Redis: `simulate.py` keeps the groups, these keep the decisions sr1's code
makes about them.
"""

from __future__ import annotations

from collections.abc import Sequence

from buffer.admission import select_batch
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


def choose_batch(version: int, held: list[Group], unconsumed: dict[str, int], pipe: Pipeline) -> list | None:
    """The batch for `version`, chosen by the learner's own batch selection (`select_batch`)."""
    schedule = StalenessSchedule(pipe.max_staleness)
    return select_batch(
        version, held, unconsumed, schedule, pipe.groups_per_step, group_id=lambda g: g.group_id
    )
