"""The learner's step coordinator (rank 0): it decides what every rank does next and is the learner's only link to
the buffer and the engines. Prompt feeding under the admission rule, batches, heartbeats, the staleness bound
(`self.staleness`, buffer/staleness.py), weight publishing, the acks of what checkpoints made durable, the record of
the groups each step used (`learner_groups.jsonl`), evaluations, and settling the run at its end.

    coordinator = StepCoordinator(job, state, prompts, resume, vocab_size, stop)  # learner/loop.py, rank 0 only
    taken = coordinator.next_batch(version)                                   # groups, REGROUP, or None: stop

The other ranks (the followers) receive each batch from it (learner/loop.py); only this rank talks to the buffer.
Whatever it does alone (the batch, forming a weight-sync group, the engines' acks, the bookkeeping after a step, its
part of a checkpoint, the metrics read, evaluations) it does while the followers are held (learner/distributed.py's
`Hold`). While a checkpoint is written it says so (`<run_dir>/.sr1-checkpointing`, common/busy.py): a stop then waits
for the checkpoint past its grace.

Redis unreachable or full: every call retries for `buffer.reconnect_s`; after that the learner waits as long as the
outage lasts, the followers held (`until_answered`, buffer/connection.py), but for a heartbeat, a metrics read or the
weight sync's own calls, which are only logged (an update that missed is sent again at the next regroup). Asked to
stop meanwhile, it exits with the error; its next life acks what its checkpoint made durable first (learner/loop.py).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from buffer.admission import BatchAssembler, PromptFeeder
from buffer.connection import RETRIED as REDIS_UNAVAILABLE
from buffer.connection import until_answered
from buffer.group_ids import RELEASED_RECORD
from buffer.redis_buffer import open_buffer
from buffer.staleness import StalenessKeeper
from buffer.stats import STALENESS_HIST, pool_metrics
from common.busy import CHECKPOINTING, clear_busy, mark_busy
from evaluation import Evaluations, Patience
from learner.algorithms.shaping import informative
from learner.checkpoints.checkpointer import Checkpointer, CheckpointWriteError, ResumeState
from learner.job import LearnerJob
from learner.packing import untrainable_reason
from learner.steps import StepHooks
from learner.stop import StopFlag
from learner.tracking import append_line, close_record
from weight_sync.process_group import WeightSyncError
from weight_sync.publisher import WeightPublisher, gather_for_wire, gather_in_step
from weight_sync.rendezvous import Rendezvous

log = logging.getLogger(__name__)

CONSUMER = "learner-0"
REGROUP = "regroup"  # next_batch's answer when the weight-sync group must be re-formed before the next step
# the off-policy figures of the last step that the learner's heartbeat carries (`sr1 buffer watch`, Prometheus)
DIAGNOSTICS = (
    "loss/offpolicy_kl",
    "loss/mismatch_kl",
    "loss/is_ess",
    "loss/clipped_frac",
    "loss/masked_frac",
    "staleness/bound",
    "staleness/mean",
    "staleness/max",
)
T = TypeVar("T")
WeightSink = Callable[[int, Iterable[tuple[str, torch.Tensor]]], None]


class StepCoordinator(StepHooks):
    """Everything only rank 0 does: Redis (feeder, assembler, version, heartbeats, acks), the publisher, the groups
    record; as `StepHooks`, its part of every checkpoint."""

    def __init__(
        self,
        job: LearnerJob,
        state: ResumeState,
        prompts: Iterable,
        resume: bool,
        vocab_size: int,
        stop: StopFlag,
    ):
        cfg = job.learner
        self.cfg = cfg
        self.stop = stop  # set: stop waiting for a batch, for the evaluations, or out a Redis outage
        self.buffer = open_buffer(job.buffer)
        self.found_version = self.buffer.version()  # the version published when this learner started
        # groups already inside the checkpoint's weights: ack before the assembler re-reads pending entries
        self.buffer.ack_durable(state.used_group_entries, state.used_group_ids, state.version)
        self.consumed_groups = state.consumed_groups
        # (entry id, group id) of the groups trained since the last checkpoint that was written: acked once one is
        self.unacked: list[tuple[str, str]] = []
        self.groups_path = Path(job.run_dir) / "learner_groups.jsonl"
        self.checkpointing = Path(job.run_dir) / CHECKPOINTING  # there while a checkpoint is written
        self.released_record = Path(job.run_dir) / RELEASED_RECORD  # released ids Redis forgot (for audits)
        self._groups_file = None  # the groups each step used, one line per step (opened by `mark_start`)
        self.diagnostics: dict[str, float] = {}  # the last step's off-policy figures, in every heartbeat
        # the staleness bound of every release version, kept in Redis and in checkpoints (buffer/staleness.py)
        self.staleness = StalenessKeeper(
            cfg.max_staleness,
            self.buffer,
            state.extra.get("staleness", {}) if resume else None,
            max(state.version, self.found_version),
        )
        self.feeder = PromptFeeder(
            self.buffer,
            prompts,
            groups_per_step=cfg.groups_per_step,
            max_staleness=self.staleness.schedule,
            cursor=state.cursor,
            shuffle_seed=job.seed if job.data.shuffle else None,  # the same order again on resume
        )
        # groups trained in steps the crash lost: released again at the version this learner goes on at; and those
        # acked by checkpoints newer than the one loaded (found torn, skipped): no surviving weights hold them
        self.recalled: list[str] = []
        if resume:
            version = max(state.version, self.found_version)
            self.recalled = self.buffer.recall_trained(self.feeder.prompt_of, version)
            self.recalled += self.buffer.recall_durable(
                self.feeder.prompt_of, after=state.version, version=version
            )
        self.assembler = BatchAssembler(
            self.buffer,
            groups_per_step=cfg.groups_per_step,
            max_staleness=self.staleness.schedule,
            consumer=CONSUMER,
            # DAPO's dynamic sampling: groups with all-equal rewards are dropped and their places released again
            keep_group=informative if cfg.algorithm.dynamic_sampling else None,
            # a group no micro-batch can hold, or with a token id outside the vocabulary, is dead-lettered with its
            # reason, never re-delivered
            untrainable=functools.partial(
                untrainable_reason, micro_batch_tokens=cfg.micro_batch_tokens, vocab_size=vocab_size
            ),
            replenish=self.feeder.pump,
        )
        self.rendezvous = Rendezvous(
            self.buffer.url, self.buffer.namespace, job.buffer.reconnect_s, job.buffer.socket_timeout_s
        )
        self.publisher = WeightPublisher(self.rendezvous, job.weight_sync, job.num_engines)
        self._last_heartbeat = 0.0
        self._next_wait_log = 0.0  # when next_batch says again what it waits for
        self._fresh = not resume  # a fresh run's first publish may take a used namespace's version back to 0
        self._regroup_failed = False  # `prepare_publish` could not form the group: this publish only gathers
        # evaluations during training, answered by the generators whoever launched the pools
        self.eval_cfg = job.eval
        self.evals = Evaluations(self.buffer, job.eval, job.run_dir)
        self._settle_patience: Patience | None = None  # after the last step: how long `settle` waits

    def heartbeat(self, version: int, status: str, force: bool = False, **details) -> None:
        """The learner's heartbeat: its version, its status and what it waits for (`waiting_for`, `waited_s`); at most
        one every 2 s unless `force`."""
        now = time.monotonic()
        if force or now - self._last_heartbeat > 2.0:
            body = {"version": version, "status": status, **self.diagnostics, **details}
            try:
                self.buffer.heartbeat(CONSUMER, "learner", body)
            except REDIS_UNAVAILABLE as err:  # a missed heartbeat is no reason to stop training
                log.warning("learner heartbeat failed: %s", err)
            self._last_heartbeat = now

    def next_batch(self, version: int, beat: Callable[[], None] = lambda: None):
        """The batch for `version`; None when asked to stop while waiting; REGROUP when the weight-sync group must be
        re-formed first (an engine left, or a new or restarted one waits for the current weights). Says what it
        waits for (heartbeat, and a log line every `learner.wait_log_s`); raises when the batch cannot come.
        `beat` is called about every second while it waits (the other ranks' `Hold`, learner/distributed.py)."""
        started = time.monotonic()
        self._next_wait_log = started + self.cfg.wait_log_s
        while True:
            beat()
            try:
                answer = self._look_for_batch(version, started)
            except (
                REDIS_UNAVAILABLE
            ) as err:  # past buffer.reconnect_s: keep waiting, the batch can still come
                log.warning("waiting for the batch of version %d: Redis unavailable (%s)", version, err)
                answer = "stop" if self.stop.is_set() else None
            if answer is not None:
                return None if answer == "stop" else answer

    def _look_for_batch(self, version: int, started: float):
        """One look for the batch (up to a second): the batch, "stop", REGROUP, or None to go on waiting."""
        self.feeder.pump()
        waited = time.monotonic() - started
        self.heartbeat(version, "waiting", waiting_for=f"the batch of version {version}", waited_s=waited)
        batch = self.assembler.next_batch(version, timeout_s=1.0)
        if batch:
            return batch
        if self.stop.is_set():
            return "stop"
        if self.publisher.needs_regroup():
            return REGROUP
        outstanding = self.assembler.outstanding()
        if self.feeder.exhausted and outstanding < self.cfg.groups_per_step:
            raise RuntimeError(
                f"the batch of version {version} cannot be completed: the prompt source is exhausted and only "
                f"{outstanding} group(s) are left to train on, fewer than learner.groups_per_step "
                f"({self.cfg.groups_per_step}); lower learner.total_steps or give more prompts"
            )
        if time.monotonic() >= self._next_wait_log:
            self._next_wait_log = time.monotonic() + self.cfg.wait_log_s
            self._log_wait(version, time.monotonic() - started, outstanding)
        return None

    def _log_wait(self, version: int, waited: float, outstanding: int) -> None:
        stats = self.buffer.stats()
        generators = sum(1 for w in self.buffer.workers() if w.get("role") == "generator")
        paused = f"; releases paused: {self.feeder.paused}" if self.feeder.paused else ""
        log.info(
            f"waiting {waited:.0f}s for the batch of version {version} ({self.cfg.groups_per_step} groups): "
            f"{len(self.assembler.held)} finished and held, {outstanding} released groups to train "
            f"({stats['buffer/generating_groups']} generating, {stats['buffer/queued_groups']} queued), "
            f"{generators} generator(s) alive, {stats['buffer/dead_letters']} dead letter(s){paused}"
        )

    def publish(
        self,
        named,
        version: int,
        dtype: torch.dtype,
        sink: WeightSink | None,
        adapter: dict | None = None,
        probe: dict | None = None,
    ) -> dict:
        """Push `version` to every engine (or the sink): the gathers and broadcasts, which every rank takes part in,
        between `prepare_publish` and `confirm_publish`, which this rank does alone. A failed push is survived: the
        engines that missed it rejoin and get the current weights at the next regroup (they claim no prompt before:
        see generators/worker.py)."""
        stats: dict = {}
        if sink is not None and not self.publisher.enabled:
            sink(version, ((name, gather_for_wire(t.detach(), dtype)) for name, t in named))
        elif self._regroup_failed:
            gather_in_step(named, dtype)  # `prepare_publish` formed no group: only the gathers, as the others
            stats = {"weight_sync/failures": self.publisher.failures}
        else:
            try:
                stats = self.publisher.publish(
                    named, version, dtype, adapter=adapter, probe=probe, regroup=False, wait_acks=False
                )
            except (WeightSyncError, TimeoutError) as err:
                log.warning(
                    "weight sync of version %d failed (%s); the group is re-formed next", version, err
                )
                stats = {"weight_sync/failures": self.publisher.failures}
        return stats

    def prepare_publish(self) -> None:
        """Before a publish, on this rank alone (the others held: learner/loop.py): re-form the weight-sync group if
        it must be (the first publish waits for `num_engines` engines; an engine joined or left), so that no other
        rank waits inside a gather meanwhile. A failure is survived: this publish only gathers, the next tries
        again."""
        self._regroup_failed = False
        try:
            if self.publisher.needs_regroup(max_age_s=0.0):
                self.publisher.regroup()
        except (WeightSyncError, TimeoutError, *REDIS_UNAVAILABLE) as err:
            self.publisher.failures += 1
            self._regroup_failed = True
            log.warning(
                "weight sync: the group could not be formed (%s); it is tried again at the next publish", err
            )

    def confirm_publish(self, version: int) -> dict:
        """After `publish`, on this rank alone (the others held): wait for the engines' acks, then publish the version
        (the engines that missed it rejoin at the next regroup)."""
        stats: dict = {}
        try:
            self.publisher.wait_for_acks(version)
        except (WeightSyncError, TimeoutError, *REDIS_UNAVAILABLE) as err:
            log.warning("weight sync of version %d failed (%s); the group is re-formed next", version, err)
            stats = {"weight_sync/failures": self.publisher.failures}
        reset = self._fresh
        self._until_answered(
            f"publish version {version}", lambda: self.buffer.publish_version(version, reset)
        )
        self._fresh = False
        return stats

    def _until_answered(self, what: str, call: Callable[[], T]) -> T:
        """`call()` however long Redis is unavailable, unless asked to stop (buffer/connection.py)."""
        return until_answered(call, what, give_up=self.stop.is_set)

    def bound_releases(self, version: int, trained: dict) -> None:
        """After a step, before `version` is published: the staleness bound of the prompts released from it on."""
        self.staleness.after_step(version, trained, give_up=self.stop.is_set)

    def explain_version(self, published: int, version: int, checkpoint: int | None, resume: bool) -> None:
        """Say why this process goes on at `version` when the buffer already holds `published` (`checkpoint`: the
        version of the weights loaded, None without a checkpoint)."""
        if resume and version != (checkpoint or 0):
            if checkpoint is None:
                latest, weights = "there is no checkpoint", "the initial weights (no checkpoint)"
            else:
                latest, weights = (
                    f"the latest checkpoint is step {checkpoint}",
                    f"step {checkpoint}'s weights",
                )
            lost, recalled = version - (checkpoint or 0), len(self.recalled)
            log.warning(
                f"resume: the published version is {published} but {latest}: continuing at version {version} with "
                f"{weights}; the {lost} step(s) since are lost and the {recalled} group(s) they trained on are "
                "generated again"
            )
        elif not resume and published > 0:
            log.warning(
                "namespace %r already published version %d but this run starts fresh at 0 (pass --resume to go on, "
                "or use a new namespace); engines holding newer weights will ignore version 0",
                self.buffer.namespace,
                published,
            )

    def mark_start(self, start: dict, skipped: list[tuple[str, str]]) -> None:
        """The line marking where this process started in `learner_groups.jsonl`, with the groups recalled and the
        checkpoints skipped (name, why)."""
        self._groups_file = open(self.groups_path, "a", buffering=1)  # noqa: SIM115 (closed by `close`)
        skipped_rows = [{"checkpoint": name, "why": why} for name, why in skipped]
        row = start | {"recalled": self.recalled, "skipped": skipped_rows}
        # a full disk: RecordsFailing, the clean stop of a full disk under checkpoints (learner/tracking.py)
        append_line(self._groups_file, json.dumps(row), self.groups_path)

    def step_header(self, taken, version: int) -> dict:
        """What every rank does next, as `next_batch`'s answer says: stop, publish (re-form the group), or train
        `taken` at `version` under these staleness bounds."""
        if taken is None:
            return {"command": "stop"}
        if taken == REGROUP:
            return {"command": "publish"}
        bounds = self.staleness.step_bounds(version, {t.group.release_version for t in taken})
        return {"command": "train", "bounds": bounds.to_json()}

    def after_step(self, taken, version: int, metrics: dict) -> None:
        """Bookkeeping once `version` is published: the off-policy figures for the heartbeat, the groups marked
        trained (they wait for a checkpoint to be acked), the staleness histogram, the groups record."""
        self.diagnostics = {k: metrics[k] for k in DIAGNOSTICS if k in metrics}
        entry_ids = [t.entry_id for t in taken]
        self._until_answered("mark the groups trained", lambda: self.buffer.mark_trained(entry_ids))
        staleness = np.concatenate(
            [(version - 1) - t.sampled_versions() for g in taken for t in g.group.trajectories]
            or [np.zeros(0)]
        )
        try:  # after a resume, re-delivered tokens may carry versions the rolled-back learner has not reached yet
            self.buffer.record_consumed(np.clip(staleness, 0, None).astype(np.int64))
        except REDIS_UNAVAILABLE as err:  # a metric: not repeated (a lost reply would count the step twice)
            log.warning("the staleness histogram misses step %d: %s", version, err)
        self.consumed_groups += len(taken)
        self.heartbeat(version, "training")
        self.unacked += [(t.entry_id, t.group.group_id) for t in taken]
        append_line(
            self._groups_file,
            json.dumps({"version": version, "group_ids": [t.group.group_id for t in taken]}),
            self.groups_path,
        )

    def checkpoint_state(self, state: ResumeState) -> None:
        # from here until it is written (or fails), a stop waits for it past the learner's grace (common/busy.py)
        mark_busy(self.checkpointing, f"checkpoint step_{state.version}")
        self.heartbeat(state.version, "checkpointing", force=True)
        state.used_group_entries = [entry for entry, _ in self.unacked]
        state.used_group_ids = [gid for _, gid in self.unacked]
        state.cursor = self.feeder.cursor
        state.consumed_groups = self.consumed_groups
        state.extra["staleness"] = self.staleness.state_dict()

    def checkpoint_saved(self, state: ResumeState, checkpointer: Checkpointer) -> None:
        def acks() -> None:
            # durable now: never re-delivered; recorded until older checkpoints are pruned (a torn one is given up)
            self.buffer.ack_durable(state.used_group_entries, state.used_group_ids, state.version)
            # every prompt before its cursor was released, and what it acked left the in-flight set: Redis forgets
            # those ids and keeps a watermark instead (buffer/group_ids.py)
            self.buffer.forget_ids(state.cursor, state.version, record=self.released_record)
            oldest = checkpointer.oldest_kept()
            if oldest is not None:
                self.buffer.forget_durable(up_to=oldest)

        self._until_answered(f"ack the groups of checkpoint step_{state.version}", acks)
        self.unacked = []
        clear_busy(self.checkpointing)

    def checkpoint_failed(self, version: int, err: CheckpointWriteError) -> None:
        clear_busy(self.checkpointing)
        self.heartbeat(version, "checkpoint failed", force=True, checkpoint_error=str(err))

    def waiting_for_checkpoint(self, version: int) -> None:
        self.heartbeat(version, "waiting", waiting_for=f"space for checkpoint step_{version}")

    def step_metrics(self) -> dict:
        """The buffer's gauges and the generator pool's figures beside the step's metrics (not the staleness
        histogram: one key per bucket). Empty while Redis is unavailable (the step's own metrics are logged)."""
        try:
            stats = self.buffer.stats()
            workers = self.buffer.workers()
        except REDIS_UNAVAILABLE as err:
            log.warning("buffer metrics unavailable for this step: %s", err)
            return {}
        gauges = {
            k: v
            for k, v in stats.items()
            if k.startswith("buffer/") and not k.startswith(STALENESS_HIST) and isinstance(v, (int, float))
        }
        return gauges | pool_metrics(workers)

    def evaluations(self, version: int, last: bool) -> list[dict]:
        """Ask for an evaluation of `version` when it is due (every `eval.every_steps`, and the last step); return
        the evaluations answered since the last call (those still out after the last step are waited for by
        `settle`)."""
        every = self.eval_cfg.every_steps
        if every and (version % every == 0 or last) and version > 0:
            if self._until_answered("find the evaluators", self.evals.answerers):
                self._until_answered("ask for an evaluation", lambda: self.evals.request(version))
            else:
                log.warning("no generator worker is alive to evaluate version %d: skipped", version)
        return self._until_answered("read the evaluations", self.evals.ready)

    def settle(self, poll_s: float = 0.5) -> tuple[str, list[dict]]:
        """What every rank does next after the last step (learner/loop.py): "publish" the final weights again (an
        engine joined, came back or left), "wait", or "done" (every evaluation answered, `eval.timeout_s` passed,
        no generator worker alive for a minute, or asked to stop); and the evaluations answered since the last
        call. Redis unavailable: "wait", for as long as it lasts (and `eval.timeout_s`)."""
        try:
            command = self._settle(poll_s)
            return command, self.evals.ready()
        except REDIS_UNAVAILABLE as err:
            log.warning("waiting for the evaluations: Redis unavailable (%s)", err)
            return ("done" if self.stop.is_set() else "wait"), []

    def _settle(self, poll_s: float) -> str:
        if self._settle_patience is None:
            self._settle_patience = Patience(self.evals, self.eval_cfg.timeout_s)
            for step in self.evals.pending.values():
                log.info("waiting for the evaluation of version %d", step)
        if not self.evals.pending or self.stop.is_set():
            return "done"
        if why := self._settle_patience.exhausted():
            log.warning("evaluation of version(s) %s %s", sorted(self.evals.pending.values()), why)
            return "done"
        self.heartbeat(max(self.evals.pending.values()), "evaluating")
        if self.publisher.needs_regroup():
            log.info("an engine lacks the final weights while evaluations are out: publishing them again")
            return "publish"
        time.sleep(poll_s)
        return "wait"

    def close(self) -> None:
        if self._groups_file is not None:
            close_record(self._groups_file, self.groups_path)  # after a full disk too (RecordsFailing stays)
        self.publisher.close()
        self.rendezvous.close()
        self.buffer.close()
