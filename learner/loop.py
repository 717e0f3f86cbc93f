"""The learner process's loop on every rank: take a batch, train, publish the weights, checkpoint, ack.

    run_learner(job, world, resume=True, stop=StopFlag())         # job: learner.job.LearnerJob

Rank 0 alone talks to Redis (prompt feeder, batch assembly, version, heartbeats, acks) and to the engines (weight
publisher); it forwards each batch to the other ranks as the group payloads it took from Redis, with a small
control header so that waiting, training and stopping stay in step on every rank.

Ack rule ("no group lost or used twice"): a group is acked only once the step that used it is in a checkpoint.
The checkpoint's resume state lists the groups used since the previous checkpoint; a restarted learner first acks
that list (a crash between saving and acking would otherwise re-deliver groups already inside the weights). Groups
trained in steps after the checkpoint (marked `trained` in Redis, never acked) are recalled: their prompts are
released again and generated anew, since training them again at later versions would break the staleness bound.
Groups taken but not trained yet come back from the learner's pending entries (same consumer name). The durable
history therefore uses every group exactly once, within the bound. All taken groups belong to the one consumer
`learner-0`: the buffer only reclaims idle entries for *another* consumer, and the assembler renews the leases of
groups it holds for later steps, so a long checkpoint interval re-delivers nothing while the learner lives.
Versions only go forward: a restart continues at the version last published (the checkpoint's, or a later one if
the crash came after it), and the engines receive the checkpoint's weights under that version before the first
step. Policy versions therefore count published weights, not durable steps.
"""

from __future__ import annotations

import functools
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch

from buffer.codec import decode_group
from buffer.records import Group
from buffer.stats import STALENESS_HIST, pool_metrics
from common.model_paths import resolve_model_path
from evaluation import Evaluations, Patience
from learner.checkpoint import Checkpointer, ResumeState
from learner.distributed import World, all_reduce, broadcast_frames
from learner.job import LearnerJob
from learner.model import DTYPES, named_weights
from learner.tracking import Tracker, merge_metrics
from learner.trainer import Learner, StepBounds
from weight_sync.group import WeightSyncError
from weight_sync.publisher import gather_for_wire, gather_in_step

log = logging.getLogger(__name__)

CONSUMER = "learner-0"
# train_step's metric: 1.0 when the update was skipped (the loss or the gradient norm was not finite)
NONFINITE_KEY = "loss/nonfinite_skipped"
REGROUP = "regroup"  # next_batch's answer when the weight-sync group must be re-formed before the next step
# the off-policy figures of the last step that the learner's heartbeat carries (`sr1 buffer watch`, Prometheus)
DIAGNOSTICS = ("loss/offpolicy_kl", "loss/mismatch_kl", "loss/is_ess", "loss/clipped_frac", "loss/masked_frac",
               "staleness/bound", "staleness/mean", "staleness/max")  # fmt: skip
WeightSink = Callable[[int, Iterable[tuple[str, torch.Tensor]]], None]


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
        log.warning("the step at version %d skipped its update (non-finite loss or gradient norm; %d in a row, "
                    "the run stops at %d); groups: %s", version, self.length, self.limit, shown)  # fmt: skip


def untrainable_reason(group: Group, micro_batch_tokens: int, vocab_size: int | None = None) -> str | None:
    """Why the learner can never train `group`, or None: a token id outside the model's vocabulary (it would fail as
    an index error inside the embedding), or a trajectory longer than one packed micro-batch, which fits in no
    micro-batch (learner/packing.py) whatever else the batch holds."""
    from buffer.codec import CodecError, check_token_ids

    if vocab_size is not None:
        try:
            check_token_ids(group, vocab_size)
        except CodecError as err:
            return str(err)
    for i, trajectory in enumerate(group.trajectories):
        if trajectory.num_tokens > micro_batch_tokens:
            return (
                f"trajectory {i} has {trajectory.num_tokens} tokens ({len(trajectory.prompt_ids)} prompt + "
                f"{len(trajectory.response_ids)} response), more than learner.micro_batch_tokens "
                f"({micro_batch_tokens})"
            )
    return None


class StopFlag:
    """Set by SIGTERM/SIGINT: the learner finishes the current step, checkpoints and exits 0."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self, *_args) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def install(self) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.set)
            signal.signal(signal.SIGINT, self.set)
        return self


def load_prompt_source(job: LearnerJob) -> list:
    """The training prompts, read by the task (its dataset readers)."""
    if not job.data.train_files:
        raise ValueError("data.train_files is empty: the learner's prompt feeder needs training prompts")
    from tasks import build_task

    return build_task(job.task).load_prompts(job.data.train_files, split="train")


def run_learner(
    job: LearnerJob,
    world: World,
    *,
    resume: bool = False,
    stop: StopFlag | None = None,
    prompts: Iterable | None = None,
    weight_sink: WeightSink | None = None,
) -> int:
    """Train until learner.total_steps or a stop signal; returns the final version.

    prompts: PromptRecords for the feeder (default: data.train_files). weight_sink: called on rank 0 with
    (version, full named tensors) after every step instead of/in addition to the engines (tests, evaluation).
    """
    cfg = job.learner
    stop = stop or StopFlag()
    run_dir = Path(job.run_dir)
    model_dir = resolve_model_path(job.model.path)  # a directory, or a hub id in the local HF cache
    tokenizer_dir = resolve_model_path(job.model.tokenizer_path, what="model.tokenizer_path") if (
        job.model.tokenizer_path) else None  # fmt: skip
    learner = Learner(
        cfg, model_dir, world, model_dtype=job.model.dtype, temperature=job.temperature, seed=job.seed,
        max_response_tokens=job.max_response_tokens,
    )  # fmt: skip
    checkpointer = Checkpointer(run_dir / "checkpoints", world, model_dir, save_dtype=job.model.dtype,
                                keep=cfg.keep_checkpoints, tokenizer_dir=tokenizer_dir)  # fmt: skip
    state = ResumeState(version=0)
    latest = checkpointer.latest() if resume else None
    if latest is not None:
        state = checkpointer.load(
            latest, learner.model, learner.optimizer, learner.scheduler, critic=learner.critic
        )
        learner.version = state.version
        learner.restore_extra(state.extra)
        log.info("resumed from %s at version %d (cursor %d)", latest, state.version, state.cursor)
    tracker = Tracker(run_dir, job.logging, world.rank, config=job.model_dump(mode="json"))
    vocab_size = learner.model.config.vocab_size
    side = _Rank0(job, state, prompts, resume, vocab_size) if world.is_main else None
    # Versions never go back: engines ignore an update older than the weights they hold, and admission counts were
    # made at the published version. A learner that crashed after its last checkpoint (or before its first) goes on
    # at the published version with the checkpoint's (or the initial) weights: the steps in between are lost, and
    # the groups they trained on are generated again (`_Rank0`).
    published = torch.tensor([side.buffer.version() if side is not None else 0], device=world.device)
    published = int(all_reduce(published, world, "max").item())
    if resume:
        learner.version = max(learner.version, published)
        if learner.version != state.version and world.is_main:
            weights = (
                f"step {state.version}'s weights"
                if latest is not None
                else "the initial weights (no checkpoint)"
            )
            log.warning(
                "resume: the published version is %d but %s: continuing at version %d with %s; the %d step(s) "
                "since are lost and the %d group(s) they trained on are generated again", published,
                f"the latest checkpoint is step {state.version}" if latest is not None else "there is no checkpoint",
                learner.version, weights, learner.version - state.version, len(side.recalled),
            )  # fmt: skip
    elif published > 0 and world.is_main:
        log.warning(
            "namespace %r already published version %d but this run starts fresh at 0 (pass --resume to go on, or "
            "use a new namespace); engines holding newer weights will ignore version 0",
            job.buffer.namespace, published,
        )  # fmt: skip
    publish_dtype = DTYPES[job.model.dtype]

    def publish(version: int) -> dict:
        named = named_weights(learner.model)
        stats: dict = {}
        if side is not None:
            stats = side.publish(named, version, publish_dtype, weight_sink)
        else:
            gather_in_step(named, publish_dtype)  # take part in rank 0's gathers: same order, same wire dtype
        return stats

    # the engines get the learner's weights as the current version (a resume rolls them back to it)
    publish(learner.version)
    used_since_checkpoint: list[str] = []
    nonfinite = NonFiniteStreak(cfg.max_nonfinite_steps)
    last_saved = learner.version if latest is not None else -1
    # the groups each step used, one line per step after a line marking where this process started
    groups_file = open(run_dir / "learner_groups.jsonl", "a", buffering=1) if world.is_main else None  # noqa: SIM115
    start = {
        "start": learner.version,
        "resumed_from": str(latest) if latest else None,
        "weights": state.version,
    }
    if groups_file is not None:
        groups_file.write(json.dumps(start | {"recalled": side.recalled}) + "\n")
    tracker.mark_segment(start | {"time": time.time()})
    try:
        while learner.version < cfg.total_steps:
            # 1. take a batch of groups (rank 0), share it with every rank
            step_start = time.perf_counter()
            taken = side.next_batch(learner.version, stop) if side is not None else None
            frames = None
            if side is not None:
                if taken is None:
                    header = {"command": "stop"}
                elif taken == REGROUP:
                    header, taken = {"command": "publish"}, []
                else:
                    header = {
                        "command": "train",
                        "bounds": side.step_bounds(learner.version, taken).to_json(),
                    }
                frames = [json.dumps(header).encode()] + [t.payload for t in taken or []]
            frames = broadcast_frames(frames, world)
            header = json.loads(frames[0])
            if header["command"] == "stop":
                break
            if header["command"] == "publish":
                # engines joined or left while we waited: they get the current weights before they sample
                publish(learner.version)
                continue
            # rank 0 decoded its groups when it took them; the others decode the payloads it forwarded
            groups = [t.group for t in taken] if taken else [decode_group(f) for f in frames[1:]]
            wait_s = time.perf_counter() - step_start
            # 2. log-probs, loss, optimizer step; version + 1 (too many non-finite steps in a row stop the run here)
            step_version = learner.version
            train_metrics = learner.train_step(groups, StepBounds.from_json(header["bounds"]))
            nonfinite.check(train_metrics, step_version, [g.group_id for g in groups])
            # the staleness bound of releases from the next version on, set before that version is published
            if side is not None:
                side.next_bound(learner.version, train_metrics)
            # 3. publish the weights to every engine, then the version
            publish_metrics = publish(learner.version)
            # 4. bookkeeping on rank 0: staleness histogram, groups awaiting their ack (until the checkpoint)
            if side is not None:
                side.after_step(taken, learner.version, train_metrics)
                used_since_checkpoint += [t.entry_id for t in taken]
                groups_file.write(
                    json.dumps({"version": learner.version, "group_ids": [g.group_id for g in groups]}) + "\n"
                )
            # 5. checkpoint, then ack what it made durable
            flag = torch.tensor([1.0 if stop.is_set() else 0.0], device=world.device)
            stopping = bool(all_reduce(flag, world, "max").item())
            done = learner.version >= cfg.total_steps
            checkpoint_s = None
            if learner.version % cfg.checkpoint_every == 0 or stopping or done:
                checkpoint_start = time.perf_counter()
                _checkpoint(checkpointer, learner, side, used_since_checkpoint)
                checkpoint_s = time.perf_counter() - checkpoint_start
                used_since_checkpoint = []
                last_saved = learner.version
            metrics = merge_metrics(
                train_metrics,
                publish_metrics,
                step_timing(time.perf_counter() - step_start, wait_s, checkpoint_s),
                tool_metrics(groups),
                side.buffer_metrics() if side is not None else {},
            )
            if learner.version % job.logging.log_every == 0 or done:
                tracker.log(metrics, step=learner.version)
            if side is not None:
                for result in side.evaluations(learner.version, last=done):
                    tracker.log_eval(result, step=result["step"])
            if stopping:
                break
        if learner.version != last_saved and learner.version > 0:
            _checkpoint(checkpointer, learner, side, used_since_checkpoint)
        if learner.version >= cfg.total_steps:
            _settle(side, world, stop, lambda: publish(learner.version), tracker)
    finally:
        tracker.close()
        if groups_file is not None:
            groups_file.close()
        if side is not None:
            side.close()
    return learner.version


def _settle(
    side: _Rank0 | None, world: World, stop: StopFlag, publish_final: Callable[[], dict], tracker: Tracker
) -> None:
    """After the last step, until the evaluations still out are answered: an engine that missed the last publish (it
    was evaluating with its weights pinned, restarting, or unreachable for `weight_sync.timeout_s`) can only answer
    an evaluation of the final version once it holds that version, and nobody but this learner can give it. So every
    rank keeps re-forming the group and publishing the final weights again whenever rank 0 says so."""
    while True:
        command = side.settle(stop) if side is not None else None
        command = broadcast_frames([command.encode()] if command else None, world)[0].decode()
        if command == "publish":
            publish_final()
        elif command == "done":
            break
        if side is not None:
            for result in side.evals.ready():
                tracker.log_eval(result, step=result["step"])


def tool_metrics(groups: list[Group]) -> dict[str, float]:
    """The batch's tool calls (searches) as the generators recorded them per trajectory: how many, how many failed
    (the model saw an error text instead of results), and their mean latency."""
    infos = [t.info for g in groups for t in g.trajectories]
    calls = sum(int(i.get("tool_calls", 0)) for i in infos)
    errors = sum(int(i.get("tool_errors", 0)) for i in infos)
    seconds = sum(float(i.get("tool_seconds", 0.0)) for i in infos)
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


def _checkpoint(checkpointer: Checkpointer, learner: Learner, side, used: list[str]) -> None:
    state = ResumeState(version=learner.version, used_group_entries=list(used), extra=learner.resume_extra())
    if side is not None:
        state.cursor = side.feeder.cursor
        state.consumed_groups = side.consumed_groups
        state.extra["staleness"] = side.staleness_state()
    # rank 0's state is the one written; the other ranks only need the collective parts
    checkpointer.save(learner.model, learner.optimizer, learner.scheduler, state, critic=learner.critic)
    if side is not None:
        side.buffer.ack(used)  # durable now: never re-delivered


class _Rank0:
    """Everything only rank 0 does: Redis (feeder, assembler, version, heartbeats, acks) and the publisher."""

    def __init__(
        self, job: LearnerJob, state: ResumeState, prompts: Iterable | None, resume: bool, vocab_size: int
    ):
        from buffer.admission import BatchAssembler, PromptFeeder, StalenessSchedule, resumed_schedule
        from buffer.redis_buffer import open_buffer
        from learner.algorithms.shaping import informative
        from weight_sync.publisher import WeightPublisher
        from weight_sync.rendezvous import Rendezvous

        cfg = job.learner
        self.cfg = cfg
        self.buffer = open_buffer(job.buffer)
        # groups already inside the checkpoint's weights: ack before the assembler re-reads pending entries
        self.buffer.ack(state.used_group_entries)
        self.consumed_groups = state.consumed_groups
        self.diagnostics: dict[str, float] = {}  # the last step's off-policy figures, in every heartbeat
        # the staleness bound of every release version (buffer/admission.py, "A bound that changes"): recorded in
        # Redis and in checkpoints; a resume keeps the bounds of versions already released at and changes the bound
        # (to the fixed one, or auto's) from the version after the published one
        from learner.staleness import StalenessController

        self.controller = StalenessController(cfg.staleness_auto) if cfg.auto_staleness else None
        saved = state.extra.get("staleness", {})
        if self.controller is not None and resume:
            self.controller.load_state_dict(saved.get("controller", {}))
        bound = self.controller.bound if self.controller is not None else int(cfg.max_staleness)
        if resume:  # Redis's record wins: it has the bounds of versions published after the checkpoint
            recorded = {int(v): int(b) for v, b in saved.get("schedule", {}).items()}
            recorded |= self.buffer.staleness_bounds()
            self.schedule = resumed_schedule(recorded, max(state.version, self.buffer.version()), bound)
        else:
            self.schedule = StalenessSchedule(bound)
        for version, b in self.schedule.changes.items():
            self.buffer.set_staleness_bound(version, b)
        self.feeder = PromptFeeder(
            self.buffer,
            load_prompt_source(job) if prompts is None else prompts,
            groups_per_step=cfg.groups_per_step,
            max_staleness=self.schedule,
            cursor=state.cursor,
            shuffle_seed=job.seed if job.data.shuffle else None,  # the same order again on resume
        )
        # groups trained in steps the crash lost: released again at the version this learner goes on at
        self.recalled: list[str] = []
        if resume:
            version = max(state.version, self.buffer.version())
            self.recalled = self.buffer.recall_trained(self.feeder.prompt_of, version)
        self.assembler = BatchAssembler(
            self.buffer,
            groups_per_step=cfg.groups_per_step,
            max_staleness=self.schedule,
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
        self.rendezvous = Rendezvous(self.buffer.url, self.buffer.namespace, job.buffer.reconnect_s)
        self.publisher = WeightPublisher(self.rendezvous, job.weight_sync, job.num_engines)
        self._last_heartbeat = 0.0
        # evaluations during training, answered by the generators whoever launched the pools
        self.eval_cfg = job.eval
        self.evals = Evaluations(self.buffer, job.eval, job.run_dir)
        self._settle_patience: Patience | None = None  # after the last step: how long `settle` waits

    def heartbeat(self, version: int, status: str, **details) -> None:
        """The learner's heartbeat: its version, its status and what it waits for (`waiting_for`, `waited_s`)."""
        now = time.monotonic()
        if now - self._last_heartbeat > 2.0:
            body = {"version": version, "status": status, **self.diagnostics, **details}
            self.buffer.heartbeat(CONSUMER, "learner", body)
            self._last_heartbeat = now

    def next_batch(self, version: int, stop: StopFlag):
        """The batch for `version`; None when asked to stop while waiting; REGROUP when the weight-sync group must be
        re-formed first (an engine left, or a new or restarted one waits for the current weights). Says what it
        waits for (heartbeat, and a log line every `learner.wait_log_s`); raises when the batch cannot come."""
        started = time.monotonic()
        next_log = started + self.cfg.wait_log_s
        while True:
            self.feeder.pump()
            waited = time.monotonic() - started
            self.heartbeat(version, "waiting", waiting_for=f"the batch of version {version}", waited_s=waited)
            batch = self.assembler.next_batch(version, timeout_s=1.0)
            if batch:
                return batch
            if stop.is_set():
                return None
            if self.publisher.needs_regroup():
                return REGROUP
            outstanding = self.assembler.outstanding()
            if self.feeder.exhausted and outstanding < self.cfg.groups_per_step:
                raise RuntimeError(
                    f"the batch of version {version} cannot be completed: the prompt source is exhausted and only "
                    f"{outstanding} group(s) are left to train on, fewer than learner.groups_per_step "
                    f"({self.cfg.groups_per_step}); lower learner.total_steps or give more prompts"
                )
            if time.monotonic() >= next_log:
                next_log = time.monotonic() + self.cfg.wait_log_s
                self._log_wait(version, time.monotonic() - started, outstanding)

    def _log_wait(self, version: int, waited: float, outstanding: int) -> None:
        stats = self.buffer.stats()
        generators = sum(1 for w in self.buffer.workers() if w.get("role") == "generator")
        log.info(
            "waiting %.0fs for the batch of version %d (%d groups): %d finished and held, %d released groups to "
            "train (%d generating, %d queued), %d generator(s) alive, %d dead letter(s)",
            waited, version, self.cfg.groups_per_step, len(self.assembler.held), outstanding,
            stats["buffer/generating_groups"], stats["buffer/queued_groups"], generators, stats["buffer/dead_letters"],
        )  # fmt: skip

    def publish(self, named, version: int, dtype: torch.dtype, sink: WeightSink | None) -> dict:
        """Push `version` to every engine (or the sink), then publish the version. A failed push is survived: the
        engines that missed it rejoin and get the current weights at the next regroup (they claim no prompt before:
        see generators/worker.py)."""
        stats: dict = {}
        if sink is not None and not self.publisher.enabled:
            sink(version, ((name, gather_for_wire(t.detach(), dtype)) for name, t in named))
        else:
            try:
                stats = self.publisher.publish(named, version, dtype)
            except (WeightSyncError, TimeoutError) as err:
                log.warning(
                    "weight sync of version %d failed (%s); the group is re-formed next", version, err
                )
                stats = {"weight_sync/failures": self.publisher.failures}
        self.buffer.publish_version(version)
        return stats

    def step_bounds(self, version: int, taken) -> StepBounds:
        """The staleness bounds the step at `version` must keep, for every rank's trainer to assert."""
        releases = {t.group.release_version for t in taken}
        return StepBounds(self.schedule.in_force(version), {r: self.schedule.at(r) for r in releases})

    def next_bound(self, version: int, metrics: dict) -> None:
        """After a step, before `version` is published: with max_staleness auto, the bound of prompts released from
        `version` on, from the step's measured mismatch (learner/staleness.py)."""
        if self.controller is None:
            return
        bound = self.controller.observe(metrics)
        if bound != self.schedule.at(version):
            log.info("staleness bound %d -> %d for prompts released from version %d (off-policy KL %.4f, ESS %.3f)",
                     self.schedule.at(version), bound, version, metrics.get("loss/offpolicy_kl", float("nan")),
                     metrics.get("loss/is_ess", float("nan")))  # fmt: skip
            self.schedule.set(version, bound)
            self.buffer.set_staleness_bound(version, bound)

    def staleness_state(self) -> dict:
        """What a checkpoint keeps of the staleness bound: the schedule, and auto's controller."""
        state: dict = {"schedule": {str(v): b for v, b in self.schedule.changes.items()}}
        if self.controller is not None:
            state["controller"] = self.controller.state_dict()
        return state

    def after_step(self, taken, version: int, metrics: dict) -> None:
        self.diagnostics = {k: metrics[k] for k in DIAGNOSTICS if k in metrics}
        self.buffer.mark_trained([t.entry_id for t in taken])
        staleness = np.concatenate(
            [(version - 1) - t.sampled_versions() for g in taken for t in g.group.trajectories]
            or [np.zeros(0)]
        )
        # after a resume, re-delivered tokens may carry versions the rolled-back learner has not reached yet
        self.buffer.record_consumed(np.clip(staleness, 0, None).astype(np.int64))
        self.consumed_groups += len(taken)
        self.heartbeat(version, "training")

    def buffer_metrics(self) -> dict:
        """The buffer's gauges and the generator pool's figures beside the step's metrics (not the staleness
        histogram: one key per bucket)."""
        stats = self.buffer.stats()
        gauges = {
            k: v
            for k, v in stats.items()
            if k.startswith("buffer/") and not k.startswith(STALENESS_HIST) and isinstance(v, (int, float))
        }
        return gauges | pool_metrics(self.buffer.workers())

    def evaluations(self, version: int, last: bool) -> list[dict]:
        """Ask for an evaluation of `version` when it is due (every `eval.every_steps`, and the last step); return
        the evaluations answered since the last call (those still out after the last step are waited for by
        `settle`)."""
        every = self.eval_cfg.every_steps
        if every and (version % every == 0 or last) and version > 0:
            if self.evals.answerers():
                self.evals.request(version)
            else:
                log.warning(
                    "no generator worker is alive to evaluate version %d: evaluation skipped", version
                )
        return self.evals.ready()

    def settle(self, stop: StopFlag, poll_s: float = 0.5) -> str:
        """What every rank does next after the last step (see `_settle`): "publish" the final weights again (an
        engine joined, came back or left), "wait", or "done" (every evaluation answered, `eval.timeout_s` passed,
        no generator worker alive for a minute, or asked to stop)."""
        if self._settle_patience is None:
            self._settle_patience = Patience(self.evals, self.eval_cfg.timeout_s)
            for step in self.evals.pending.values():
                log.info("waiting for the evaluation of version %d", step)
        if not self.evals.pending or stop.is_set():
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
        self.publisher.close()
        self.rendezvous.close()
        self.buffer.close()
