"""A training step as every learner rank takes it, once the batch is known, and what each rank holds for it.

    steps = RankSteps(job, world, resume=True, stop=stop)   # the model and optimizer, checkpointer, tracker
    steps.agree_on_version(published_here)                   # every rank goes on at the newest published version
    metrics = steps.train(groups, header)                    # one optimizer step: version + 1
    stopping = steps.finish_step(hooks, groups, metrics, ...)  # the stop vote, checkpoint and acks, the metrics row

`learner/loop.py` runs the coordinator's loop (rank 0) and the followers' loop on top of this. Around the collective
parts, rank 0 adds its own duties (the resume state it writes, acks, heartbeats, the buffer's gauges) through
`StepHooks`, which `learner/coordinator.py`'s `StepCoordinator` implements; the other ranks pass the plain
`StepHooks()`, which adds nothing. Rank 0 does them `alone`: the other ranks are held meanwhile, however long they
take (a Redis outage is waited out there).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from buffer.records import Group
from buffer.staleness import StepBounds
from common.heap import release_free_heap
from common.model_paths import resolve_model_path, resolve_tokenizer_path
from learner.checkpoints.checkpointer import Checkpointer, CheckpointWriteError, Resumed, ResumeState
from learner.checkpoints.safety_net import FINAL_RETRY_S, CheckpointsFailing, SafetyNet
from learner.distributed import Hold, World, all_reduce, wait_while_held
from learner.job import LearnerJob
from learner.stop import StopFlag
from learner.tracking import Tracker, merge_metrics
from learner.trainer import Learner

log = logging.getLogger(__name__)

# train_step's metric: 1.0 when the update was skipped (the loss or the gradient norm was not finite)
NONFINITE_KEY = "loss/nonfinite_skipped"
T = TypeVar("T")


class NonFiniteTrainingError(RuntimeError):
    """Too many updates in a row were skipped for a non-finite loss or gradient norm: the run stops before a
    checkpoint is written."""


class NonFiniteStreak:
    """Counts steps in a row whose update was skipped (`loss/nonfinite_skipped`); `check` raises at `limit`."""

    def __init__(self, limit: int):
        self.limit = limit
        self.length = 0

    def check(self, metrics: dict, version: int, group_ids: list[str]) -> None:
        """Record one step's metrics (the step that started at `version`, on the groups `group_ids`)."""
        if metrics.get(NONFINITE_KEY, 0.0) < 1.0:
            self.length = 0
            return
        self.length += 1
        shown = ", ".join(group_ids[:16]) + (
            f" and {len(group_ids) - 16} more" if len(group_ids) > 16 else ""
        )
        if self.length >= self.limit:
            raise NonFiniteTrainingError(
                f"the step at version {version} skipped its update: the loss or gradient norm was not finite, "
                f"{self.length} step(s) in a row (learner.max_nonfinite_steps={self.limit}); stopping before a "
                f"checkpoint is written. The batch's groups: {shown}"
            )
        log.warning(
            "the step at version %d skipped its update (non-finite loss or gradient norm; %d in a row, "
            "the run stops at %d); groups: %s",
            version,
            self.length,
            self.limit,
            shown,
        )


_TOOL_INFO_KEYS = ("tool_calls", "tool_errors", "tool_seconds")


def _tool_figures(info: Any) -> tuple[float, float, float] | None:
    """A trajectory's (calls, errors, seconds) from its `info`, or None when they are not finite numbers >= 0."""
    if not isinstance(info, dict):
        return None
    values = [info.get(key, 0) for key in _TOOL_INFO_KEYS]
    if not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
        for v in values
    ):
        return None
    return values[0], values[1], values[2]


def tool_metrics(groups: list[Group]) -> dict[str, float]:
    """The batch's tool calls (searches) as the generators recorded them per trajectory: how many, how many failed
    (the model saw an error text instead of results), and their mean latency. A trajectory whose figures are
    malformed (another writer's records) is left out of them, with a warning naming its group: it is still trained
    on, and the learner never stops over a figure it only reports."""
    calls = errors = seconds = 0.0
    malformed: set[str] = set()
    for group in groups:
        for trajectory in group.trajectories:
            figures = _tool_figures(trajectory.info)
            if figures is None:
                malformed.add(group.group_id)
                continue
            calls, errors, seconds = calls + figures[0], errors + figures[1], seconds + figures[2]
    if malformed:
        log.warning(
            "tool figures (%s) left out of the step's metrics for malformed trajectory infos in group(s) %s",
            ", ".join(_TOOL_INFO_KEYS),
            ", ".join(sorted(malformed)[:8])
            + (f" and {len(malformed) - 8} more" if len(malformed) > 8 else ""),
        )
    return {
        "tools/calls": float(calls),
        "tools/errors": float(errors),
        "tools/error_rate": errors / calls if calls else 0.0,
        "tools/latency_s": seconds / calls if calls else 0.0,
    }


def step_timing(step_s: float, wait_s: float, checkpoint_s: float | None = None) -> dict[str, float]:
    """The loop's own metrics: the whole step's wall time, the part spent waiting for a batch, and the checkpoint's
    time on the steps that saved one."""
    timing = {"perf/step_s": step_s, "perf/wait_s": wait_s}
    if checkpoint_s is not None:
        timing["perf/checkpoint_s"] = checkpoint_s
    return timing


class StepHooks:
    """What rank 0 adds to the parts of a step that every rank takes together. These do nothing: the followers
    (ranks 1..n-1) pass them as they are; `StepCoordinator` (learner/coordinator.py) fills them in."""

    def checkpoint_state(self, state: ResumeState) -> None:
        """Add this rank's part to the resume state about to be saved (rank 0's is the one written)."""

    def checkpoint_saved(self, state: ResumeState, checkpointer: Checkpointer) -> None:
        """The checkpoint of `state.version` is written: what it holds is durable."""

    def checkpoint_failed(self, version: int, err: CheckpointWriteError) -> None:
        """The checkpoint of `version` could not be written (the safety net decides what follows)."""

    def waiting_for_checkpoint(self, version: int) -> None:
        """Called about twice a second while the run's last checkpoint waits to be tried again."""

    def step_metrics(self) -> dict:
        """Metrics of this rank's own for the step's row, read after the checkpoint."""
        return {}


class RankSteps:
    """One learner rank's share of the run: the model and optimizer (`Learner`), loaded from the newest checkpoint
    that verifies when resuming, the checkpointer and its safety net, the non-finite guard and the tracker."""

    def __init__(self, job: LearnerJob, world: World, *, resume: bool, stop: StopFlag):
        self.cfg = job.learner
        self.world = world
        self.hold = Hold(world)  # rank 0's: keeps the other ranks waiting while it does something alone
        self.stop = stop
        self.resume = resume
        self.log_every = job.logging.log_every
        run_dir = Path(job.run_dir)
        model_dir = resolve_model_path(job.model.path)  # a directory, or a hub id in the local HF cache
        tokenizer_dir = resolve_tokenizer_path(job.model)  # model.tokenizer_path, else model_dir
        self.learner = Learner(
            self.cfg,
            model_dir,
            world,
            model_dtype=job.model.dtype,
            temperature=job.temperature,
            seed=job.seed,
            max_response_tokens=job.max_response_tokens,
        )
        self.checkpointer = Checkpointer(
            run_dir / "checkpoints",
            world,
            model_dir,
            save_dtype=job.model.dtype,
            keep=self.cfg.keep_checkpoints,
            # a tokenizer kept apart from the model is copied beside the model's files
            tokenizer_dir=tokenizer_dir if tokenizer_dir != model_dir else None,
            lora=self.cfg.lora,
        )
        self.state = ResumeState(version=0)
        self.resumed = Resumed(None, None)
        # the newest checkpoint that verifies and loads; those skipped are named (CheckpointLoadError: none)
        if resume:
            learner = self.learner
            self.resumed = self.checkpointer.resume(
                learner.model, learner.optimizer, learner.scheduler, critic=learner.critic
            )
        if self.resumed.state is not None:
            self.state = self.resumed.state
            self.learner.version = self.state.version
            self.learner.restore_extra(self.state.extra)
            log.info(
                "resumed from %s at version %d (cursor %d)",
                self.resumed.path,
                self.state.version,
                self.state.cursor,
            )
        self.tracker = Tracker(run_dir, job.logging, world.rank, config=job.model_dump(mode="json"))
        self.nonfinite = NonFiniteStreak(self.cfg.max_nonfinite_steps)
        self.net = SafetyNet(self.checkpointer, self.state.version if self.has_checkpoint else None)
        self.last_saved = -1  # the version of this process's last checkpoint (set by agree_on_version)

    @property
    def version(self) -> int:
        return self.learner.version

    @property
    def has_checkpoint(self) -> bool:
        """Whether the weights came from a checkpoint (else: the initial weights)."""
        return self.resumed.path is not None

    @property
    def done(self) -> bool:
        return self.learner.version >= self.cfg.total_steps

    def alone(self, fn: Callable[[], T]) -> T | None:
        """`fn()` on rank 0 while the other ranks wait for it, however long it takes (`Hold`); None on the others,
        which do not call `fn`. Every rank calls it at the same point."""
        if self.world.is_main:
            return self.hold.run(fn)
        wait_while_held(self.world)
        return None

    def agree_on_version(self, published_here: int) -> int:
        """The newest version published, as the ranks agree on it (only rank 0 reads it; the others pass 0). Versions
        never go back: engines ignore an update older than the weights they hold, and admission counts were made at
        the published version. So a resumed learner that crashed after its last checkpoint (or before its first)
        goes on at the published version with the checkpoint's (or the initial) weights: the steps in between are
        lost, and the groups they trained on are generated again (`StepCoordinator`)."""
        published = torch.tensor([published_here], device=self.world.device)
        published = int(all_reduce(published, self.world, "max").item())
        if self.resume:
            self.learner.version = max(self.learner.version, published)
        self.last_saved = self.learner.version if self.has_checkpoint else -1
        return published

    def mark_start(self) -> dict:
        """Where this process started (version, checkpoint, its weights' version), marked in the metrics."""
        start = {
            "start": self.learner.version,
            "resumed_from": str(self.resumed.path) if self.resumed.path else None,
            "weights": self.state.version,
        }
        self.tracker.mark_segment(start | {"time": time.time()})
        return start

    def train(self, groups: list[Group], header: dict) -> dict:
        """Log-probs, loss, optimizer step on `groups` under the header's staleness bounds; version + 1. Too many
        non-finite steps in a row stop the run here (NonFiniteTrainingError)."""
        step_version = self.learner.version
        metrics = self.learner.train_step(groups, StepBounds.from_json(header["bounds"]))
        self.nonfinite.check(metrics, step_version, [g.group_id for g in groups])
        return metrics

    def stop_requested(self) -> bool:
        """Whether any rank was asked to stop (a collective: every rank asks at the same point)."""
        flag = torch.tensor([1.0 if self.stop.is_set() else 0.0], device=self.world.device)
        return bool(all_reduce(flag, self.world, "max").item())

    def finish_step(
        self,
        hooks: StepHooks,
        groups: list[Group],
        trained: dict,
        published: dict,
        step_start: float,
        wait_s: float,
    ) -> bool:
        """After the weights are published: the stop vote, the checkpoint when due (then the acks of what it made
        durable), the step's metrics row (`trained`: train_step's, `published`: the weight sync's). Returns whether the run stops here. A failed save leaves its groups
        unacked for the next one; the second failure in a row mid-run raises CheckpointsFailing, after this step's
        metrics row (the run's last checkpoint is retried by `final_checkpoint` instead)."""
        stopping = self.stop_requested()
        version = self.learner.version
        checkpoint_s, failed, failing = None, self.net.failed_in_a_row, None
        if version % self.cfg.checkpoint_every == 0 or stopping or self.done:
            checkpoint_start = time.perf_counter()
            try:
                if self._checkpoint(hooks, last=stopping or self.done):
                    self.last_saved = version
            except CheckpointsFailing as err:
                failing = err
            checkpoint_s = time.perf_counter() - checkpoint_start
        row = merge_metrics(
            trained,
            published,
            step_timing(time.perf_counter() - step_start, wait_s, checkpoint_s),
            self.net.metrics(),
            tool_metrics(groups),
            self.alone(hooks.step_metrics) or {},
        )
        if version % self.log_every == 0 or self.done or self.net.failed_in_a_row != failed:
            self.tracker.log(row, step=version)
        # Batches of a different packed length every step: give the pages freed since back, so that this process's
        # resident memory shows what it holds (`common/heap.py`).
        release_free_heap()
        if failing is not None:
            raise failing
        return stopping

    def final_checkpoint(self, hooks: StepHooks) -> None:
        """The last checkpoint of this process (the run's end, or a stop), unless the last step already saved one:
        its weights exist nowhere else. At the run's end it is tried until it is written, waiting longer between
        tries (a full disk someone frees); asked to stop (or asked while waiting), one more try, then
        CheckpointsFailing."""
        version = self.learner.version
        if version == self.last_saved or version == 0:
            return
        waits = iter(FINAL_RETRY_S)
        failed_already = (
            bool(self.net.failed_steps) and self.net.failed_steps[-1] == version
        )  # tried in the loop
        while True:
            if failed_already:
                wait_s = next(waits, FINAL_RETRY_S[-1])
                log.error("the run's last checkpoint (step %d) is tried again in %.0f s", version, wait_s)
                deadline = time.monotonic() + wait_s
                while time.monotonic() < deadline and not self.stop.is_set():
                    hooks.waiting_for_checkpoint(version)
                    time.sleep(0.5)
            stopping = self.stop_requested()
            if self._checkpoint(hooks, last=True):
                return
            if stopping:
                raise CheckpointsFailing(
                    f"the checkpoint of step {version} could not be written and the learner was asked to stop: "
                    f"{self.net.last_failure}"
                )
            failed_already = True

    def _checkpoint(self, hooks: StepHooks, last: bool) -> bool:
        """Save a checkpoint and let the hooks ack what it made durable; False when it could not be written (the
        safety net decides whether the run goes on: see learner/checkpoints/safety_net.py)."""
        learner = self.learner
        state = ResumeState(version=learner.version, extra=learner.resume_extra())
        self.alone(lambda: hooks.checkpoint_state(state))
        try:
            self.checkpointer.save(
                learner.model, learner.optimizer, learner.scheduler, state, critic=learner.critic, export=last
            )
        except CheckpointWriteError as err:
            self.net.failed(err, learner.version, learner.model, last=last)
            failure = err
            self.alone(lambda: hooks.checkpoint_failed(learner.version, failure))
            return False
        self.net.saved(learner.version)
        self.alone(lambda: hooks.checkpoint_saved(state, self.checkpointer))
        return True

    def close(self) -> None:
        self.tracker.close()
