"""`select_batch`, the learner's choice of a step's groups as a pure function: required groups first, earliest
deadline first, the rest filled with the oldest finished groups, None while a required group is still generating."""

from __future__ import annotations

from dataclasses import dataclass

from buffer.admission import select_batch
from buffer.staleness import StalenessSchedule


@dataclass(frozen=True)
class Finished:
    group_id: str


def choose(version, held, unconsumed, bound, groups_per_step):
    batch = select_batch(
        version,
        [Finished(g) for g in held],
        unconsumed,
        StalenessSchedule(bound),
        groups_per_step,
        group_id=lambda f: f.group_id,
    )
    return None if batch is None else [f.group_id for f in batch]


def test_the_oldest_finished_groups_fill_the_batch_in_stream_order():
    assert choose(0, ["c", "a", "b"], {"a": 0, "b": 0, "c": 0}, bound=1, groups_per_step=2) == ["c", "a"]


def test_groups_at_their_deadline_come_first_whatever_finished_before_them():
    # at version 1 with bound 1, x and y (released at 0) are due; z (released at 1) finished first but can wait
    unconsumed = {"x": 0, "y": 0, "z": 1}
    assert choose(1, ["z", "x", "y"], unconsumed, bound=1, groups_per_step=2) == ["x", "y"]


def test_a_required_group_still_generating_means_no_batch_yet():
    assert choose(0, ["b", "c"], {"a": 0, "b": 0, "c": 0}, bound=0, groups_per_step=2) is None
    assert choose(0, ["b"], {"b": 0}, bound=2, groups_per_step=2) is None  # too few finished


def test_every_group_the_bound_needs_is_taken_even_past_groups_per_step():
    assert choose(0, ["a", "b", "c"], {"a": 0, "b": 0, "c": 0}, bound=0, groups_per_step=2) == ["a", "b", "c"]


def test_the_inputs_are_left_as_they_were():
    held, unconsumed = [Finished("a"), Finished("b")], {"a": 0, "b": 0}
    select_batch(0, held, unconsumed, StalenessSchedule(0), 1, group_id=lambda f: f.group_id)
    assert held == [Finished("a"), Finished("b")] and unconsumed == {"a": 0, "b": 0}
