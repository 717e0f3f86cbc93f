"""Bounded staleness by construction: the prompt feeder's admission rule and the learner's batch assembly.

    feeder = PromptFeeder(buf, dataset, groups_per_step=64, max_staleness=2)       # learner rank 0
    assembler = BatchAssembler(buf, groups_per_step=64, max_staleness=2)
    for u in range(start, steps):
        feeder.pump()                                   # release what the rule allows at the published version
        batch = assembler.next_batch(u)                 # TakenGroups to train on at version u
        ...train, publish version u + 1, checkpoint (with feeder.cursor)...
        buf.ack([t.entry_id for t in batch])

The rule (AReaL, Fu et al. 2025, section 5.1): release a prompt only while
`released < (max_staleness + version + 1) * groups_per_step`. A group's tokens are sampled at versions >= its
`release_version`, so a step at version u that contains every unfinished group released at u - max_staleness or
earlier never consumes a token older than max_staleness versions. Nothing is dropped for being late; the learner
waits only for those required stragglers.

Choosing the batch. Let N(t) be the groups released at version <= t and not yet consumed (finished or not). Every
step consumes groups_per_step (G) groups, so after the step at u the next j steps can absorb only j*G of them:
the step at u must therefore take at least N(u + j - max_staleness) - j*G groups released at version
<= u + j - max_staleness, for every j in 0..max_staleness-1 (j = 0 is the hard bound itself). If every earlier
step respected these quotas, each is at most G (admission caps N(u + j - s) at (j + 1) * G). Filling the batch
with whatever finished first would otherwise leave more than G required groups for some later step (for example
s=2, G=1: a quick group released at version 1 taken at step 1 leaves two groups of version 0 for step 2).
The assembler meets the quotas with finished groups, oldest release first, waits when it cannot, and fills the
rest of the batch with the oldest finished groups (stream order). With max_staleness = 0 every released group is
required at the next step: synchronous on-policy training.

Dynamic sampling (DAPO; `keep_group`). A finished group the filter rejects (all rewards equal) is dropped as soon as
the assembler takes it: acked at once, out of the in-flight set, counted in the buffer's `dropped` counter. The
feeder over-releases by exactly that count: `released < (max_staleness + version + 1) * groups_per_step + dropped`.
A dropped group is then as if never released (it is neither trained nor waited for), so the rule above holds for
the groups that remain: the ones released at version <= t and not yet consumed or dropped number at most
(max_staleness + t + 1) * G minus those already trained, as without drops, and every quota is still at most G. A
group that will be dropped still counts while it runs (required stragglers are waited for), so nothing trained is
ever older than the bound, and every batch holds groups_per_step kept groups. Dropping is immediate, not deferred to
a checkpoint like a trained group's ack: a dropped group is in no step's weights, so a crash cannot make it count
twice; its prompt is not released again (its group id was released).

Lost work (dead letters). A released group can also leave the pipeline for good without being trained: its prompt is
dead-lettered as poison (every lease expired) or as failed (`buffer.max_prompt_deliveries` failed tries), its payload
is malformed or oversized, or the learner cannot train it (`untrainable`, e.g. a trajectory over its token budget).
Each leaves the in-flight set and is counted as `abandoned` in the same transaction, and the feeder over-releases by
that count too: `released < (max_staleness + version + 1) * groups_per_step + dropped + abandoned`. The argument is the
one for dropped groups, word for word: an abandoned group is as if never released, so the quotas and the bound hold
for the groups that remain, and every batch can still be completed. Without the replacement a synchronous run
(max_staleness 0) would wait forever for a batch one group short; the assembler therefore asks for replacements
(`replenish`, the feeder's pump) while it waits, not only between steps.

A bound that changes (`learner.max_staleness: auto`; a resume with another bound). Write s(v) for the bound that
prompts released at version v are given (`StalenessSchedule`: it changes only at step boundaries, before the version
it applies to is published, and never for a version that has released anything, so every release knows its own
bound for good). A group released at r has the deadline d = r + s(r): it must be trained at a step <= d, so its
tokens (sampled at versions >= r) are never more than s(r) versions old when trained. The feeder releases at version v
only while `released < (s(v) + v + 1) * G` (+ replaced groups, as above). Then, for every D, at most (D + 1) * G groups
ever released have a deadline <= D: take the last of them to be released, at version v with v + s(v) <= D; when it was
released fewer than (s(v) + v + 1) * G <= (D + 1) * G groups had been, and every other group with a deadline <= D came
before it. Steps u, u + 1, ..., u + j consume (j + 1) * G groups, and the steps before u consumed u * G, so at most
(j + 1) * G unconsumed groups have a deadline <= u + j: exactly the condition under which the quotas below can be met.
The assembler's quotas are the ones above with "released at version <= u + j - max_staleness" read as "deadline <=
u + j" (for a constant bound they are the same sets): the step at u takes at least M(u + j) - j * G of the groups with
a deadline <= u + j, M counting the unconsumed ones, for every j from 0 to the latest deadline - u - 1 (a full batch
meets the quotas beyond). Earliest deadline first meets all of them at once, and each is at most G by the count above.

Raising the bound at version v is therefore immediate: releases at v get the larger deadline and the window opens by
(new - old) * G. Lowering it from s to s' < s takes effect over the next s steps and never breaks a promise: the
feeder releases nothing until the version has caught up with what is already out (the limit (s' + v + 1) * G is below
what was released at v - 1), groups released earlier keep their deadline r + s, and new releases get v + s'. The
bound in force for the step at u (`in_force`, the learner's `staleness/bound`) is the largest s(r) of a release
version r <= u whose deadline r + s(r) >= u: no token a step at u may legally train is older. It falls to s' at step
v + s, once the last group released under s has met its deadline. The learner asserts, per group, that no loss token
is older than the bound its prompt was released under, and that none is older than the bound in force for the step
(learner/staleness.py, `check_staleness`). The schedule lives in Redis beside the version (`ReplayBuffer.
staleness_bounds`) and in every checkpoint; a resumed learner reads it back and changes the bound from the version
after the one it resumes at, so the deadlines of the groups still in flight never change.

Redis's memory (buffer/memory.py). The feeder also releases nothing while Redis's used_memory is above
`buffer.memory_high_water` of its maxmemory: the admission rule already bounds what is released, and holding back
releases only delays steps, so the bound holds as above. What was released still finishes and is trained, which
frees its memory (a trained group's payload leaves Redis), and releases resume.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from buffer.records import Group, PromptRecord
from buffer.redis_buffer import ReplayBuffer, TakenGroup

log = logging.getLogger(__name__)

_EPOCH = re.compile(r"(?P<base>.*)/e(?P<epoch>\d+)(?P<suffix>(/dup\d+)?)")  # make_group_id's layout


_PAUSE_LOG_S = 30.0  # while releases are paused for memory, a warning this often


def admission_limit(version: int, *, groups_per_step: int, max_staleness: int) -> int:
    """How many groups may have been released in total while the learner is at `version`."""
    return (max_staleness + version + 1) * groups_per_step


def _check_step_shape(groups_per_step: int, max_staleness: int) -> None:
    if groups_per_step < 1:
        raise ValueError(f"groups_per_step must be >= 1, got {groups_per_step}")
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")


class StalenessSchedule:
    """The staleness bound s(v) that prompts released at version v are given, a step function of v (see "A bound that
    changes" above). `set(v, b)` makes b the bound from version v on; v may not be below a version already set, so a
    version's bound never changes once something may have been released under it (set it before publishing v).

        schedule = StalenessSchedule(2)             # a constant bound: 2 for every version
        schedule.set(10, 4); schedule.at(12)        # 4
        schedule.deadline(9), schedule.in_force(11) # 11 (= 9 + 2), 4
    """

    def __init__(self, bound: int | dict[int, int]):
        changes = {0: bound} if isinstance(bound, int) else dict(bound)
        if not changes:
            raise ValueError("a staleness schedule needs at least one bound")
        self._changes: dict[int, int] = {}
        for version in sorted(changes):
            self.set(int(version), int(changes[version]))

    @property
    def changes(self) -> dict[int, int]:
        """version -> the bound from that version on (what is persisted)."""
        return dict(self._changes)

    @property
    def last_version(self) -> int:
        """The latest version the schedule was set at."""
        return max(self._changes)

    def set(self, version: int, bound: int) -> None:
        if bound < 0:
            raise ValueError(f"a staleness bound must be >= 0, got {bound} (version {version})")
        if version < 0:
            raise ValueError(f"a staleness bound needs a version >= 0, got {version}")
        if self._changes and version < self.last_version:
            raise ValueError(
                f"the staleness bound of version {version} cannot change: the schedule is already set from version "
                f"{self.last_version} (a bound only changes for versions nothing was released at yet)"
            )
        if self._changes and self.at(version) == bound:
            return  # no change: keep the schedule short
        self._changes[version] = bound

    def at(self, version: int) -> int:
        """The bound of prompts released at `version` (before the first change: the first bound)."""
        keys = [v for v in self._changes if v <= version]
        return self._changes[max(keys)] if keys else self._changes[min(self._changes)]

    def deadline(self, release_version: int) -> int:
        """The last step that may train a group released at `release_version`."""
        return release_version + self.at(release_version)

    def in_force(self, version: int) -> int:
        """The bound in force for the step at `version`: the largest bound of a release version r <= version whose
        deadline is not past (r + s(r) >= version). No token this step may legally train is older."""
        versions = sorted(self._changes)
        best = self.at(version)
        for i, start in enumerate(versions):
            if start > version:
                break
            end = min(
                versions[i + 1] - 1 if i + 1 < len(versions) else version, version
            )  # last r of this piece
            bound = self._changes[start]
            if end + bound >= version:
                best = max(best, bound)
        return best

    def maximum(self) -> int:
        """The largest bound ever set (what the assembler reads ahead for)."""
        return max(self._changes.values())


def resumed_schedule(recorded: dict[int, int], version: int, bound: int) -> StalenessSchedule:
    """The schedule a learner resuming at `version` goes on with: the bounds `recorded` (Redis, the checkpoint) for
    every version up to `version`, which may have released prompts under them, and `bound` from `version + 1` on."""
    if not recorded:
        return StalenessSchedule({version: bound})
    schedule = StalenessSchedule({v: b for v, b in recorded.items() if v <= version} or recorded)
    schedule.set(max(version + 1, schedule.last_version), bound)
    return schedule


def _schedule(max_staleness: int | StalenessSchedule) -> StalenessSchedule:
    return max_staleness if isinstance(max_staleness, StalenessSchedule) else StalenessSchedule(max_staleness)


class PromptFeeder:
    """Releases prompts from a dataset into the buffer as fast as the admission rule allows (learner rank 0).

    `prompts` is a sequence of PromptRecords (indexed by the cursor, cycling through epochs with epoch-unique
    group ids) or an iterable (the first `cursor` items are skipped on resume). `cursor` counts prompts taken from
    the dataset; save it in learner checkpoints. A prompt released before a crash and taken again after a resume
    from an older cursor is skipped by the buffer (its group_id was released), so resuming never duplicates.
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
        self.schedule = _schedule(max_staleness)
        _check_step_shape(groups_per_step, self.schedule.at(0))
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
            batch = []
            while len(batch) < room:
                prompt = self._next_prompt()
                if prompt is None:
                    break
                batch.append(dataclasses.replace(prompt, release_version=version))
            if not batch:
                break
            released += len(self.buffer.release_prompts(batch))  # skipped re-releases leave room: loop again
        return released


class BatchAssembler:
    """Builds the learner's batch for the step at version u (see the module docstring for the rule).

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
        self.schedule = _schedule(max_staleness)
        _check_step_shape(groups_per_step, self.schedule.at(0))
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

    def _select(self, version: int, unconsumed: dict[str, int]) -> list[TakenGroup] | None:
        """The batch for `version` from the held groups, or None if it needs groups that are not finished yet."""
        g = self.groups_per_step
        deadline = {gid: self.schedule.deadline(rv) for gid, rv in unconsumed.items()}
        held = list(self._held.values())  # stream order: oldest finished first
        due = {t.entry_id: deadline[t.group.group_id] for t in held}
        by_deadline = sorted(held, key=lambda t: due[t.entry_id])  # stable: stream order within a deadline
        # for a constant bound s the latest deadline is version + s: the quotas j = 0..s-1 of the module docstring
        horizon = max(max(deadline.values(), default=version), version + self.schedule.at(version)) - version
        chosen: dict[str, TakenGroup] = {}
        for j in range(max(horizon, 1)):
            threshold = version + j
            quota = sum(1 for d in deadline.values() if d <= threshold) - j * g
            have = sum(1 for eid in chosen if due[eid] <= threshold)
            for t in by_deadline:
                if have >= quota:
                    break
                if due[t.entry_id] <= threshold and t.entry_id not in chosen:
                    chosen[t.entry_id] = t
                    have += 1
            if have < quota:
                return None
        if len(chosen) > g:
            log.warning(
                "step at version %d needs %d groups to keep the staleness bound (%d in force), more than "
                "groups_per_step=%d (admission was not followed, e.g. a resume at another version); taking them all",
                version,
                len(chosen),
                self.schedule.in_force(version),
                g,
            )
        for t in held:
            if len(chosen) >= g:
                break
            chosen.setdefault(t.entry_id, t)
        if len(chosen) < g:
            return None
        return [t for t in held if t.entry_id in chosen]

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
            batch = self._select(version, unconsumed)
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
