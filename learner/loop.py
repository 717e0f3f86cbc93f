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

import json
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from buffer.codec import decode_group
from buffer.records import Group
from buffer.staleness import StepBounds
from common.model_paths import resolve_model_path, resolve_tokenizer_path
from learner.checkpoint import Checkpointer, CheckpointWriteError, Resumed, ResumeState
from learner.distributed import World, all_reduce, broadcast_frames
from learner.job import LearnerJob
from learner.model import DTYPES, named_weights
from learner.rank0 import REGROUP, Rank0, WeightSink
from learner.safety_net import FINAL_RETRY_S, CheckpointsFailing, SafetyNet
from learner.stop import StopFlag
from learner.tracking import Tracker, merge_metrics
from learner.trainer import Learner
from weight_sync.publisher import gather_in_step

log = logging.getLogger(__name__)

# train_step's metric: 1.0 when the update was skipped (the loss or the gradient norm was not finite)
NONFINITE_KEY = "loss/nonfinite_skipped"


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

    prompts: the PromptRecords rank 0 feeds (required there, ignored on the other ranks); the entry point reads
    them from data.train_files, without the overlong ones (`sr1/entrypoints/learner.py`'s `training_prompts`).
    weight_sink: called on rank 0 with (version, full named tensors) after every step instead of/in addition to the
    engines (tests, evaluation).
    """
    if world.is_main and prompts is None:
        raise ValueError("run_learner: rank 0 needs the training prompts (prompts=...) to feed the buffer")
    cfg = job.learner
    stop = stop or StopFlag()
    run_dir = Path(job.run_dir)
    model_dir = resolve_model_path(job.model.path)  # a directory, or a hub id in the local HF cache
    tokenizer_dir = resolve_tokenizer_path(job.model)  # model.tokenizer_path, else model_dir
    learner = Learner(
        cfg,
        model_dir,
        world,
        model_dtype=job.model.dtype,
        temperature=job.temperature,
        seed=job.seed,
        max_response_tokens=job.max_response_tokens,
    )
    checkpointer = Checkpointer(
        run_dir / "checkpoints",
        world,
        model_dir,
        save_dtype=job.model.dtype,
        keep=cfg.keep_checkpoints,
        tokenizer_dir=tokenizer_dir
        if tokenizer_dir != model_dir
        else None,  # copied beside the model's files
    )
    state = ResumeState(version=0)
    resumed = Resumed(None, None)
    # the newest checkpoint that verifies and loads; those skipped are named (CheckpointLoadError: none)
    if resume:
        resumed = checkpointer.resume(
            learner.model, learner.optimizer, learner.scheduler, critic=learner.critic
        )
    latest = resumed.path
    if resumed.state is not None:
        state = resumed.state
        learner.version = state.version
        learner.restore_extra(state.extra)
        log.info("resumed from %s at version %d (cursor %d)", latest, state.version, state.cursor)
    tracker = Tracker(run_dir, job.logging, world.rank, config=job.model_dump(mode="json"))
    vocab_size = learner.model.config.vocab_size
    side = Rank0(job, state, prompts, resume, vocab_size) if world.is_main else None
    # Versions never go back: engines ignore an update older than the weights they hold, and admission counts were
    # made at the published version. A learner that crashed after its last checkpoint (or before its first) goes on
    # at the published version with the checkpoint's (or the initial) weights: the steps in between are lost, and
    # the groups they trained on are generated again (`Rank0`).
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
                "since are lost and the %d group(s) they trained on are generated again",
                published,
                f"the latest checkpoint is step {state.version}"
                if latest is not None
                else "there is no checkpoint",
                learner.version,
                weights,
                learner.version - state.version,
                len(side.recalled),
            )
    elif published > 0 and world.is_main:
        log.warning(
            "namespace %r already published version %d but this run starts fresh at 0 (pass --resume to go on, or "
            "use a new namespace); engines holding newer weights will ignore version 0",
            job.buffer.namespace,
            published,
        )
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
    # (entry id, group id) of the groups trained since the last checkpoint that was written
    used_since_checkpoint: list[tuple[str, str]] = []
    nonfinite = NonFiniteStreak(cfg.max_nonfinite_steps)
    last_saved = learner.version if latest is not None else -1
    net = SafetyNet(checkpointer, state.version if latest is not None else None)
    # the groups each step used, one line per step after a line marking where this process started
    groups_file = open(run_dir / "learner_groups.jsonl", "a", buffering=1) if world.is_main else None  # noqa: SIM115
    start = {
        "start": learner.version,
        "resumed_from": str(latest) if latest else None,
        "weights": state.version,
    }
    if groups_file is not None:
        skipped = [{"checkpoint": name, "why": why} for name, why in resumed.skipped]
        groups_file.write(json.dumps(start | {"recalled": side.recalled, "skipped": skipped}) + "\n")
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
                        "bounds": side.staleness.step_bounds(
                            learner.version, {t.group.release_version for t in taken}
                        ).to_json(),
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
                side.staleness.after_step(learner.version, train_metrics)
            # 3. publish the weights to every engine, then the version
            publish_metrics = publish(learner.version)
            # 4. bookkeeping on rank 0: staleness histogram, groups awaiting their ack (until the checkpoint)
            if side is not None:
                side.after_step(taken, learner.version, train_metrics)
                used_since_checkpoint += [(t.entry_id, t.group.group_id) for t in taken]
                groups_file.write(
                    json.dumps({"version": learner.version, "group_ids": [g.group_id for g in groups]}) + "\n"
                )
            # 5. checkpoint, then ack what it made durable
            flag = torch.tensor([1.0 if stop.is_set() else 0.0], device=world.device)
            stopping = bool(all_reduce(flag, world, "max").item())
            done = learner.version >= cfg.total_steps
            checkpoint_s, failed, failing = None, net.failed_in_a_row, None
            if learner.version % cfg.checkpoint_every == 0 or stopping or done:
                # a failed save leaves its groups unacked for the next one; the second failure in a row mid-run
                # raises CheckpointsFailing, after this step's metrics row (the run's last checkpoint is retried
                # below instead)
                checkpoint_start = time.perf_counter()
                try:
                    if _checkpoint(
                        checkpointer, learner, side, used_since_checkpoint, net, last=stopping or done
                    ):
                        used_since_checkpoint = []
                        last_saved = learner.version
                except CheckpointsFailing as err:
                    failing = err
                checkpoint_s = time.perf_counter() - checkpoint_start
            metrics = merge_metrics(
                train_metrics,
                publish_metrics,
                step_timing(time.perf_counter() - step_start, wait_s, checkpoint_s),
                net.metrics(),
                tool_metrics(groups),
                side.buffer_metrics() if side is not None else {},
            )
            if learner.version % job.logging.log_every == 0 or done or net.failed_in_a_row != failed:
                tracker.log(metrics, step=learner.version)
            if failing is not None:
                raise failing
            if side is not None:
                for result in side.evaluations(learner.version, last=done):
                    tracker.log_eval(result, step=result["step"])
            if stopping:
                break
        if learner.version != last_saved and learner.version > 0:
            _last_checkpoint(checkpointer, learner, side, used_since_checkpoint, net, stop, world)
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
    side: Rank0 | None, world: World, stop: StopFlag, publish_final: Callable[[], dict], tracker: Tracker
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


def _checkpoint(
    checkpointer: Checkpointer,
    learner: Learner,
    side,
    used: list[tuple[str, str]],
    net: SafetyNet,
    last: bool = False,
) -> bool:
    """Save a checkpoint and ack the groups it made durable; False when it could not be written (`net` decides
    whether the run goes on: see learner/safety_net.py). `used`: (entry id, group id) of the groups trained since the
    last good checkpoint."""
    state = ResumeState(
        version=learner.version,
        used_group_entries=[entry for entry, _ in used],
        used_group_ids=[gid for _, gid in used],
        extra=learner.resume_extra(),
    )
    if side is not None:
        state.cursor = side.feeder.cursor
        state.consumed_groups = side.consumed_groups
        state.extra["staleness"] = side.staleness.state_dict()
    # rank 0's state is the one written; the other ranks only need the collective parts
    try:
        checkpointer.save(learner.model, learner.optimizer, learner.scheduler, state, critic=learner.critic)
    except CheckpointWriteError as err:
        net.failed(err, learner.version, learner.model, last=last)
        if side is not None:
            side.heartbeat(learner.version, "checkpoint failed", force=True, checkpoint_error=str(err))
        return False
    net.saved(learner.version)
    if side is not None:
        # durable now: never re-delivered; recorded until older checkpoints are pruned (a torn one is given up)
        side.buffer.ack_durable(state.used_group_entries, state.used_group_ids, learner.version)
        oldest = checkpointer.oldest_kept()
        if oldest is not None:
            side.buffer.forget_durable(up_to=oldest)
    return True


def _last_checkpoint(
    checkpointer: Checkpointer,
    learner: Learner,
    side,
    used: list[tuple[str, str]],
    net: SafetyNet,
    stop: StopFlag,
    world: World,
) -> None:
    """The last checkpoint of this process (the run's end, or a stop): its weights exist nowhere else. At the run's
    end it is tried until it is written, waiting longer between tries (a full disk someone frees); asked to stop (or
    asked while waiting), one more try, then CheckpointsFailing."""
    waits = iter(FINAL_RETRY_S)
    failed_already = bool(net.failed_steps) and net.failed_steps[-1] == learner.version  # tried in the loop
    while True:
        if failed_already:
            wait_s = next(waits, FINAL_RETRY_S[-1])
            log.error("the run's last checkpoint (step %d) is tried again in %.0f s", learner.version, wait_s)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and not stop.is_set():
                if side is not None:
                    side.heartbeat(
                        learner.version, "waiting", waiting_for=f"space for checkpoint step_{learner.version}"
                    )
                time.sleep(0.5)
        flag = torch.tensor([1.0 if stop.is_set() else 0.0], device=world.device)
        stopping = bool(all_reduce(flag, world, "max").item())
        if _checkpoint(checkpointer, learner, side, used, net, last=True):
            return
        if stopping:
            raise CheckpointsFailing(
                f"the checkpoint of step {learner.version} could not be written and the learner was asked to stop: "
                f"{net.last_failure}"
            )
        failed_already = True
