"""Bounded staleness: everything that decides, applies or checks how old a trained token may be.

    learner:
      max_staleness: 2                                   # a fixed bound (0: synchronous, on-policy)
      max_staleness: auto                                # or one that follows the measured off-policy mismatch
      max_staleness: {auto: {floor: 1, ceiling: 16, target_kl: 0.05}}

What this module promises (docs/staleness.md proves it, and says how to change it):

- No loss token is trained more than s(r) versions after its prompt's release version r, where s(r) is the bound
  prompts released at r were given, nor more than the bound in force for its step (`StalenessSchedule.in_force`).
- The bound holds by construction: the feeder releases a prompt at version v only while fewer than
  `admission_limit(v, ...)` groups were released (plus one per group that left untrained), the assembler meets every
  group's deadline r + s(r) earliest first, and no batch is ever short because of it. Nothing is dropped for being
  late: the learner waits only for required stragglers.
- A bound changes only at a step boundary, before the version it applies to is published, and never for a version
  that has released anything: raising it opens the window at once, lowering it takes effect as the groups released
  under the old bound meet their deadlines. A resumed learner keeps the bounds of every version already released at.
- Every rank's trainer asserts the step's `StepBounds` on every loss token (`check_staleness`), and a generator
  never samples a prompt with weights older than its release (`may_sample`).

Who calls what: buffer/admission.py (`admission_limit`, `StalenessSchedule`), the learner's coordinator
(`StalenessKeeper`: the bound of each version, fixed or buffer/auto_staleness.py's `StalenessController`'s, kept in
Redis and in checkpoints, and each step's `StepBounds`), every learner rank (`check_staleness`), the generator
worker (`may_sample`), `sr1 plan`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Annotated, Any, Protocol

import numpy as np
from pydantic import BeforeValidator, Discriminator, Tag

from buffer.auto_staleness import AutoStaleness, StalenessController
from buffer.connection import until_answered
from buffer.records import Group

log = logging.getLogger(__name__)


# -- the config: one key, a fixed bound or an `auto` section (its knobs and controller: buffer/auto_staleness.py)


def _bound_or_auto(value: Any) -> Any:
    """`auto` is the auto section with its defaults; a number given as text is that number; a negative bound or any
    other text is refused, naming the key."""
    if isinstance(value, str):
        text = value.strip()
        if text == "auto":
            return {"auto": {}}
        try:
            value = int(text)
        except ValueError:
            raise ValueError(
                f"learner.max_staleness must be an integer >= 0 or 'auto', got {value!r}"
            ) from None
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        raise ValueError(f"learner.max_staleness must be >= 0 or 'auto', got {value}")
    if isinstance(value, dict) and set(value) != {"auto"}:
        raise ValueError(
            f"learner.max_staleness as a section holds the one key auto: {{auto: {{floor: ..., ceiling: ...}}}}, "
            f"got {value!r}"
        )
    if not isinstance(value, (int, dict, AutoStaleness)):
        raise ValueError(
            f"learner.max_staleness must be an integer >= 0, 'auto' or {{auto: {{floor: ..., ceiling: ...}}}}, "
            f"got {value!r}"
        )
    return value


def _form(value: Any) -> str:
    return "fixed" if isinstance(value, int) else "auto"


# the type of `learner.max_staleness`: a section is validated as the auto section only (its errors alone reported)
MaxStaleness = Annotated[
    Annotated[int, Tag("fixed")] | Annotated[AutoStaleness, Tag("auto")],
    Discriminator(_form),
    BeforeValidator(_bound_or_auto),
]


def is_auto(max_staleness: int | AutoStaleness) -> bool:
    return isinstance(max_staleness, AutoStaleness)


def largest_bound(max_staleness: int | AutoStaleness) -> int:
    """The largest bound a run can ever use: the fixed bound, or auto's ceiling."""
    return max_staleness.auto.ceiling if is_auto(max_staleness) else int(max_staleness)


def first_bound(max_staleness: int | AutoStaleness) -> int:
    """The bound of the first steps: the fixed bound, or auto's initial one."""
    return max_staleness.auto.start if is_auto(max_staleness) else int(max_staleness)


def describe(max_staleness: int | AutoStaleness) -> int | str:
    """The bound for reports: the number, or "auto"."""
    return "auto" if is_auto(max_staleness) else int(max_staleness)


# -- admission and the bound of each release version


def admission_limit(version: int, *, groups_per_step: int, max_staleness: int) -> int:
    """How many groups may have been released in total while the learner is at `version` (before replacements)."""
    return (max_staleness + version + 1) * groups_per_step


def check_step_shape(groups_per_step: int, max_staleness: int) -> None:
    if groups_per_step < 1:
        raise ValueError(f"groups_per_step must be >= 1, got {groups_per_step}")
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")


def may_sample(release_version: int, weights_version: int) -> bool:
    """Whether an engine holding `weights_version` may sample a prompt released at `release_version`: a group's
    tokens must be sampled at versions >= its release, or they would be older than the bound admission promised."""
    return release_version <= weights_version


class StalenessSchedule:
    """The staleness bound s(v) that prompts released at version v are given, a step function of v. `set(v, b)`
    makes b the bound from version v on; v may not be below a version already set, so a version's bound never changes
    once something may have been released under it (set it before publishing v).

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


def as_schedule(max_staleness: int | StalenessSchedule) -> StalenessSchedule:
    """A fixed bound as a constant schedule; a schedule as it is (shared by the feeder and the assembler)."""
    return max_staleness if isinstance(max_staleness, StalenessSchedule) else StalenessSchedule(max_staleness)


# -- each step's bounds and the check of every trained token


class StalenessError(RuntimeError):
    """A batch holds a loss token older than the staleness bound: admission control was bypassed."""


@dataclasses.dataclass(frozen=True)
class StepBounds:
    """The staleness bounds a step keeps: `in_force`, the bound in force for the step (`staleness/bound`), and
    `by_release`, release version -> the bound prompts released at it were given. A fixed bound s is
    `StepBounds(s)`; the coordinator sends the other ranks its schedule's figures (`StalenessKeeper.step_bounds`)."""

    in_force: int
    by_release: dict[int, int] = dataclasses.field(default_factory=dict)

    def of(self, group: Group) -> int:
        """The largest staleness a loss token of `group` may have at this step."""
        return min(self.in_force, self.by_release.get(group.release_version, self.in_force))

    def to_json(self) -> dict:
        return {"in_force": self.in_force, "by_release": {str(k): v for k, v in self.by_release.items()}}

    @classmethod
    def from_json(cls, data: dict) -> StepBounds:
        return cls(int(data["in_force"]), {int(k): int(v) for k, v in data.get("by_release", {}).items()})


def batch_staleness(groups: list[Group], version: int) -> np.ndarray:
    """Per loss token: learner version of this step - version that sampled the token."""
    parts = [version - t.sampled_versions() for g in groups for t in g.trajectories]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def check_staleness(groups: list[Group], version: int, max_staleness: int | StepBounds) -> np.ndarray:
    """Per-token staleness of the batch; raise StalenessError if a loss token is older than its bound: the bound its
    prompt was released under, and the bound in force for the step (`max_staleness`: one bound for every token, or
    a step's StepBounds)."""
    bounds = StepBounds(max_staleness) if isinstance(max_staleness, int) else max_staleness
    for g in groups:
        oldest = g.min_version()
        if oldest is None:
            continue
        allowed = bounds.of(g)
        if version - oldest > allowed:
            released = bounds.by_release.get(g.release_version)
            raise StalenessError(
                f"batch at version {version} has a token {version - oldest} versions old in group {g.group_id}, "
                f"more than its bound {allowed} (bound in force {bounds.in_force}; released at version "
                f"{g.release_version}" + (f" under bound {released}" if released is not None else "") + ")"
            )
    return batch_staleness(groups, version)


# -- the learner coordinator's bound


class BoundRecord(Protocol):
    """Where the schedule is kept beside the version (buffer/redis_buffer.py's ReplayBuffer)."""

    def staleness_bounds(self) -> dict[int, int]: ...

    def set_staleness_bound(self, version: int, bound: int) -> None: ...


class StalenessKeeper:
    """The bound of every release version, as the learner's coordinator keeps it: fixed, or set after each step by
    `StalenessController`; written to `record` (Redis, beside the version) as it changes and into every checkpoint
    (`state_dict`). A resumed keeper reads both back and changes the bound only from the version after `version`,
    so the deadlines of the groups still in flight never change.

        keeper = StalenessKeeper(cfg.max_staleness, buffer)                     # a fresh run
        keeper = StalenessKeeper(cfg.max_staleness, buffer, saved, version=7)   # resumed at version 7
        keeper.step_bounds(u, release_versions)      # what every rank asserts at the step at u
        keeper.after_step(u + 1, metrics)            # before u + 1 is published: the bound of its releases
    """

    def __init__(
        self,
        max_staleness: int | AutoStaleness,
        record: BoundRecord,
        saved: dict[str, Any] | None = None,
        version: int = 0,
    ):
        """`saved`: a checkpoint's `state_dict()` (`{}` when it has none) when resuming at `version`; None for a
        fresh run."""
        self.record = record
        self.controller = StalenessController(max_staleness.auto) if is_auto(max_staleness) else None
        if self.controller is not None and saved is not None:
            self.controller.load_state_dict(saved.get("controller", {}))
        bound = self.controller.bound if self.controller is not None else int(max_staleness)
        if (
            saved is not None
        ):  # Redis's record wins: it has the bounds of versions published after the checkpoint
            recorded = {
                int(v): int(b) for v, b in saved.get("schedule", {}).items()
            } | record.staleness_bounds()
            self.schedule = resumed_schedule(recorded, version, bound)
        else:
            self.schedule = StalenessSchedule(bound)
        for v, b in self.schedule.changes.items():
            record.set_staleness_bound(v, b)

    def step_bounds(self, version: int, release_versions: set[int]) -> StepBounds:
        """The bounds the step at `version` must keep, for a batch of groups released at `release_versions`."""
        return StepBounds(self.schedule.in_force(version), {r: self.schedule.at(r) for r in release_versions})

    def after_step(
        self, version: int, metrics: dict[str, Any], give_up: Callable[[], bool] = lambda: True
    ) -> None:
        """After a step, before `version` is published: with auto, the bound of prompts released from `version` on,
        from the step's measured mismatch. Its write is made again while Redis stays unavailable, until `give_up()`
        (`until_answered`, buffer/connection.py)."""
        if self.controller is None:
            return
        bound = self.controller.observe(metrics)
        if bound != self.schedule.at(version):
            log.info(
                "staleness bound %d -> %d for prompts released from version %d (off-policy KL %.4f, ESS %.3f)",
                self.schedule.at(version),
                bound,
                version,
                metrics.get("loss/offpolicy_kl", float("nan")),
                metrics.get("loss/is_ess", float("nan")),
            )
            self.schedule.set(version, bound)
            until_answered(
                lambda: self.record.set_staleness_bound(version, bound), "the staleness bound", give_up
            )

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the schedule, and auto's controller."""
        state: dict[str, Any] = {"schedule": {str(v): b for v, b in self.schedule.changes.items()}}
        if self.controller is not None:
            state["controller"] = self.controller.state_dict()
        return state
