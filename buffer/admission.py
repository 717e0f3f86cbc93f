"""Bounded staleness by construction: the prompt feeder's admission rule and the learner's batch assembly.

    feeder = PromptFeeder(buf, dataset, groups_per_step=64, max_staleness=2)       # learner rank 0
    assembler = BatchAssembler(buf, groups_per_step=64, max_staleness=2)
    for u in range(start, steps):
        feeder.pump()                                   # release what the rule allows at the published version
        batch = assembler.next_batch(u)                 # TakenGroups to train on at version u
        ...train, publish version u + 1, checkpoint (with feeder.cursor)...
        buf.ack([t.entry_id for t in batch])

The feeder releases prompts only while `buffer/staleness.py`'s admission limit allows, under the bound its
`StalenessSchedule` gives the version; the assembler takes, for the step at u, every group whose deadline (release
version + its bound) has come, earliest deadline first, waits only for those required stragglers, and fills the rest
of the batch with the oldest finished groups (stream order). So no trained token is older than its bound and every
batch can be completed (docs/staleness.md proves both). Nothing is dropped for being late.

Groups that leave without being trained are replaced: a group the dynamic-sampling filter rejects (DAPO,
`keep_group`) is dropped as soon as it is taken (acked, counted in the buffer's `dropped` counter), and a group
dead-lettered as poison, failed, malformed, oversized or untrainable is counted as `abandoned`; the feeder releases
one more prompt for each (`ReplayBuffer.replaced_count`), and the assembler asks for replacements (`replenish`, the
feeder's pump) while it waits, so a synchronous run (max_staleness 0) never waits forever for a batch one group short.

Redis's memory (buffer/memory.py). The feeder also releases nothing while Redis's used_memory is above
`buffer.memory_high_water` of its maxmemory: the admission rule already bounds what is released, and holding back
releases only delays steps, so the bound holds (docs/staleness.md). What was released still finishes and is trained,
which frees its memory (a trained group's payload leaves Redis), and releases resume.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TypeVar

import numpy as np

from buffer.records import Group, PromptRecord
from buffer.redis_buffer import ReplayBuffer, TakenGroup
from buffer.staleness import StalenessSchedule, admission_limit, as_schedule, check_step_shape

log = logging.getLogger(__name__)

_EPOCH = re.compile(r"(?P<base>.*)/e(?P<epoch>\d+)(?P<suffix>(/dup\d+)?)")  # make_group_id's layout


_PAUSE_LOG_S = 30.0  # while releases are paused for memory, a warning this often


class PromptFeeder:
    """Releases prompts from a dataset into the buffer as fast as the admission rule allows (learner rank 0).

    `prompts` is a sequence of PromptRecords (indexed by the cursor, cycling through epochs with epoch-unique
    group ids) or an iterable (the first `cursor` items are skipped on resume). `cursor` counts prompts taken from
    the dataset; save it in learner checkpoints. A prompt released before a crash and taken again after a resume
    from an older cursor is skipped by the buffer (its group_id was released, or its position, the cursor it was
    taken at, is below the watermark of ids the buffer forgot: buffer/group_ids.py), so resuming never duplicates.
    `max_staleness` is a bound or a `StalenessSchedule` (shared with the assembler) whose bound may change.

    With `shuffle_seed`, each epoch of a sequence is walked in its own random order, a function of the seed and the
    epoch only: sources merged file after file come out interleaved, and a resume at any cursor continues the same
    order (numpy's PCG64, identical on every machine).
    """

    def __init__(
        self,
        buffer: ReplayBuffer,
        prompts: Sequence[PromptRecord] | Iterable[PromptRecord],
        *,
        groups_per_step: int,
        max_staleness: int | StalenessSchedule,
        cursor: int = 0,
        shuffle_seed: int | None = None,
    ):
        self.schedule = as_schedule(max_staleness)
        check_step_shape(groups_per_step, self.schedule.at(0))
        self.buffer = buffer
        self.shuffle_seed = shuffle_seed
        self._order: tuple[int, np.ndarray] | None = None  # (epoch, its permutation)
        self.groups_per_step = groups_per_step
        self.cursor = cursor
        self.exhausted = False
        self.paused: str | None = (
            None  # why the last pump released nothing although the rule allowed it (memory)
        )
        self._pause_logged = -_PAUSE_LOG_S
        self._by_id: dict[str, PromptRecord] | None = (
            None  # epoch-0 group id -> prompt, built when first needed
        )
        self._sequence: Sequence[PromptRecord] | None = None
        self._iterator: Iterator[PromptRecord] | None = None
        self._taken_back: list[PromptRecord] = []  # of an iterator: prompts a failed release gave back
        if hasattr(prompts, "__getitem__") and hasattr(prompts, "__len__"):
            if len(prompts) == 0:
                raise ValueError("the prompt dataset is empty")
            self._sequence = prompts
        else:
            if shuffle_seed is not None:
                raise ValueError("shuffling needs the prompts as a sequence, not an iterator")
            self._iterator = iter(prompts)
            for _ in range(cursor):  # resume: skip what an earlier run already took
                if next(self._iterator, None) is None:
                    self.exhausted = True
                    break

    def _next_prompt(self) -> PromptRecord | None:
        if self._sequence is not None:
            epoch, i = divmod(self.cursor, len(self._sequence))
            prompt = self._sequence[self._position(epoch, i)]
            if epoch:  # the same question in a later epoch is a different group
                prompt = prompt.in_epoch(epoch)
        elif self._taken_back:
            prompt = self._taken_back.pop(0)
        else:
            prompt = next(self._iterator, None)
            if prompt is None:
                self.exhausted = True
                return None
        self.cursor += 1
        return prompt

    def _position(self, epoch: int, i: int) -> int:
        """Where the epoch's i-th prompt sits in the dataset."""
        if self.shuffle_seed is None:
            return i
        if self._order is None or self._order[0] != epoch:
            rng = np.random.Generator(np.random.PCG64([self.shuffle_seed, epoch]))
            self._order = (epoch, rng.permutation(len(self._sequence)))
        return int(self._order[1][i])

    def prompt_of(self, group_id: str) -> PromptRecord:
        """The prompt behind a group id this feeder released (any epoch), to release it again."""
        if self._sequence is None:
            raise ValueError("prompts given as an iterator cannot be looked up again; give a sequence")
        if self._by_id is None:
            self._by_id = {p.in_epoch(0).group_id: p for p in self._sequence}
        match = _EPOCH.fullmatch(group_id)
        prompt = self._by_id.get(f"{match['base']}/e0{match['suffix']}") if match else None
        if prompt is None:
            raise ValueError(f"group {group_id!r} is not in the prompt dataset (was the dataset changed?)")
        return prompt.in_epoch(int(match["epoch"]))

    def pump(self) -> int:
        """Release as many prompts as the rule allows now, stamped with the current version, under the bound the
        schedule gives that version; return how many. Groups that left without being trained (dropped by dynamic
        sampling, dead-lettered) are replaced: each one raises the limit by one. Nothing is released while Redis's
        memory is above the high water (`paused` says why)."""
        released = 0
        self.paused = None
        while not self.exhausted:
            version = self.buffer.version()
            limit = (
                admission_limit(
                    version, groups_per_step=self.groups_per_step, max_staleness=self.schedule.at(version)
                )
                + self.buffer.replaced_count()
            )
            room = limit - self.buffer.released_count()
            if room <= 0:
                break
            self.paused = self.buffer.release_pause_reason()
            if self.paused is not None:
                if time.monotonic() - self._pause_logged >= _PAUSE_LOG_S:
                    self._pause_logged = time.monotonic()
                    log.warning("releases paused: %s", self.paused)
                break
            start, batch = self.cursor, []
            while len(batch) < room:
                prompt = self._next_prompt()
                if prompt is None:
                    break
                batch.append(dataclasses.replace(prompt, release_version=version))
            if not batch:
                break
            try:
                # each prompt's position lets the buffer forget released ids below a checkpoint's cursor
                positions = range(start, start + len(batch))
                released += len(self.buffer.release_prompts(batch, positions))
            except BaseException:
                self._take_back(start, batch)
                raise
            # skipped re-releases leave room: loop again
        return released

    def _take_back(self, start: int, batch: list[PromptRecord]) -> None:
        """A release that failed (Redis unreachable past `reconnect_s`): the cursor goes back to `start`, so the next
        pump releases the same prompts (any the failed call did release are skipped then), and a checkpoint never
        saves a cursor past a prompt that was not released."""
        self.cursor = start
        if self._iterator is not None:
            self._taken_back = batch + self._taken_back
            self.exhausted = False


class BatchAssembler:
    """Builds the learner's batch for the step at version u (the rule: docs/staleness.md, "Choosing the batch").

    Groups taken from Redis but not used yet stay here, unacked, for later steps; after a restart with the same
    `consumer` they come back from the buffer's pending entries. The caller acks a batch once its step is durable.
    With `keep_group` (dynamic sampling) a group it rejects is dropped when taken, and `replenish` (the feeder's pump)
    is called so that its replacement is released at once. With `untrainable` (a group's reason it cannot be trained,
    or None) such a group is dead-lettered by the learner with that reason when taken, and replaced the same way.
    `replenish` is also called while a batch is waited for: a group dead-lettered elsewhere (a poison prompt, a
    malformed payload) is replaced without waiting for the next step.
    """

    def __init__(
        self,
        buffer: ReplayBuffer,
        *,
        groups_per_step: int,
        max_staleness: int | StalenessSchedule,
        consumer: str = "learner-0",
        take_count: int | None = None,
        keep_group: Callable[[Group], bool] | None = None,
        untrainable: Callable[[Group], str | None] | None = None,
        replenish: Callable[[], object] | None = None,
    ):
        self.schedule = as_schedule(max_staleness)
        check_step_shape(groups_per_step, self.schedule.at(0))
        self.buffer = buffer
        self.groups_per_step = groups_per_step
        self.consumer = consumer
        # admission bounds unconsumed groups by (bound + 1) * G, so this takes everything available
        self.take_count = take_count
        self.keep_group = keep_group
        self.untrainable = untrainable
        self.replenish = replenish
        self.dropped = 0  # groups this assembler dropped (dynamic sampling)
        self.dead_lettered = 0  # groups this assembler dead-lettered as untrainable
        self._held: dict[str, TakenGroup] = {}
        self._hold(buffer.pending_groups(consumer))
        self._handed: set[str] = set()  # group ids returned by next_batch and not acked yet
        self._reconnects = buffer.reconnects.count
        self.waited_s = 0.0  # time the last next_batch spent waiting for required groups or a full batch

    @property
    def held(self) -> list[TakenGroup]:
        return list(self._held.values())

    def _hold(self, taken: list[TakenGroup]) -> None:
        """Keep taken groups for batches; dead-letter the untrainable ones and drop (ack, count) the ones the
        dynamic-sampling filter rejects, then ask for their replacements."""
        kept = []
        for t in taken:
            reason = self.untrainable(t.group) if self.untrainable is not None else None
            if reason is None:
                kept.append(t)
                continue
            log.warning(
                "group %s cannot be trained: %s; dead-lettered and replaced", t.group.group_id, reason
            )
            self.buffer.dead_letter_taken(t, reason)
            self._held.pop(t.entry_id, None)
            self.dead_lettered += 1
        rejected = {t.entry_id for t in kept if self.keep_group is not None and not self.keep_group(t.group)}
        for t in kept:
            if t.entry_id not in rejected:
                self._held.setdefault(t.entry_id, t)
        if rejected:
            self.buffer.drop(sorted(rejected))
            self.dropped += len(rejected)
        if (rejected or len(kept) < len(taken)) and self.replenish is not None:
            self.replenish()

    def _pull(self, block_ms: int) -> None:
        count = self.take_count or (self.schedule.maximum() + 2) * self.groups_per_step
        self._hold(self.buffer.take(count, consumer=self.consumer, block_ms=block_ms))
        if self.buffer.reconnects.count != self._reconnects:
            # Redis went away: a read whose reply was lost delivered entries to us that we never saw; they are in
            # our pending list (a live learner never reclaims its own entries), so take them back from there
            self._reconnects = self.buffer.reconnects.count
            self._hold(
                [t for t in self.buffer.pending_groups(self.consumer) if t.group.group_id not in self._handed]
            )

    def outstanding(self) -> int:
        """Released groups not handed out in a batch yet (held here, queued or still generating): what the next
        batches can be made of without new releases."""
        inflight = set(self.buffer.inflight()) - self._handed
        return len(inflight | {t.group.group_id for t in self._held.values()})

    def next_batch(self, version: int, timeout_s: float | None = None) -> list[TakenGroup]:
        """The groups to train on at `version` (normally groups_per_step), waiting for required stragglers or
        for enough finished groups. Returns [] if `timeout_s` passes first (the caller decides: retry or stop)."""
        start = time.monotonic()
        deadline = None if timeout_s is None else start + timeout_s
        self._pull(block_ms=0)
        while True:
            inflight = self.buffer.inflight()
            self._handed &= inflight.keys()  # acked groups leave the in-flight set
            unconsumed = {gid: rv for gid, rv in inflight.items() if gid not in self._handed}
            for t in self._held.values():  # groups put without a release (tests, benchmarks) still count
                unconsumed.setdefault(t.group.group_id, t.group.release_version)
            batch = select_batch(
                version, list(self._held.values()), unconsumed, self.schedule, self.groups_per_step
            )
            if batch is not None and len(batch) > self.groups_per_step:
                log.warning(
                    "step at version %d needs %d groups to keep the staleness bound (%d in force), more than "
                    "groups_per_step=%d (admission was not followed, e.g. a resume at another version); taking them "
                    "all",
                    version,
                    len(batch),
                    self.schedule.in_force(version),
                    self.groups_per_step,
                )
            if batch is not None:
                for t in batch:
                    del self._held[t.entry_id]
                    self._handed.add(t.group.group_id)
                # keep the leftovers leased to this learner so no one reclaims them while they wait here
                self.buffer.renew_taken(self.consumer, list(self._held))
                self.waited_s = time.monotonic() - start
                return batch
            # a group dead-lettered while we wait (poison prompt, malformed payload) is replaced now, not next step
            if self.replenish is not None:
                self.replenish()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                self.waited_s = time.monotonic() - start
                return []
            self.buffer.renew_taken(self.consumer, list(self._held))
            wait_ms = 1000 if remaining is None else max(1, min(1000, int(remaining * 1000)))
            self._pull(block_ms=wait_ms)


T = TypeVar("T")


def taken_group_id(taken: TakenGroup) -> str:
    return taken.group.group_id


def select_batch(
    version: int,
    held: Sequence[T],
    unconsumed: Mapping[str, int],
    schedule: StalenessSchedule,
    groups_per_step: int,
    group_id: Callable[[T], str] = taken_group_id,
) -> list[T] | None:
    """The batch for the step at `version`, or None if it needs groups that are not finished yet. A pure function:
    `held` are the finished groups at hand in stream order (oldest finished first; `group_id` reads an item's group
    id), `unconsumed` every released group not trained yet (group id -> release version, the held ones included),
    `schedule` the staleness bound of each release version. The batch holds every group whose deadline (release
    version + its bound) has come, earliest deadline first, and is filled up to `groups_per_step` with the oldest
    finished groups; it holds more than `groups_per_step` only when the bound needs them all (admission was not
    followed). Returned in stream order. `BatchAssembler` and the planner's simulation (`sr1/plan/admission.py`)
    both choose with it."""
    g = groups_per_step
    deadline = {gid: schedule.deadline(rv) for gid, rv in unconsumed.items()}
    due = [deadline[group_id(t)] for t in held]
    by_deadline = sorted(range(len(held)), key=lambda i: due[i])  # stable: stream order within a deadline
    # for a constant bound s the latest deadline is version + s: the quotas j = 0..s-1 (docs/staleness.md)
    horizon = max(max(deadline.values(), default=version), version + schedule.at(version)) - version
    chosen: dict[int, None] = {}  # positions in `held`, an ordered set
    for j in range(max(horizon, 1)):
        threshold = version + j
        quota = sum(1 for d in deadline.values() if d <= threshold) - j * g
        have = sum(1 for i in chosen if due[i] <= threshold)
        for i in by_deadline:
            if have >= quota:
                break
            if due[i] <= threshold and i not in chosen:
                chosen[i] = None
                have += 1
        if have < quota:
            return None
    for i in range(len(held)):
        if len(chosen) >= g:
            break
        chosen.setdefault(i, None)
    if len(chosen) < g:
        return None
    return [t for i, t in enumerate(held) if i in chosen]
