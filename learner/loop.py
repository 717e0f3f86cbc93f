"""The learner process's loop: take a batch, train, publish the weights, checkpoint, ack.

    run_learner(job, world, resume=True, stop=StopFlag(), prompts=...)   # job: learner.job.LearnerJob

Rank 0 runs the coordinator's loop (`_coordinate`): its `StepCoordinator` alone talks to Redis (prompt feeder, batch
assembly, version, heartbeats, acks) and to the engines (weight publisher), and it forwards each batch to the other
ranks as the group payloads it took from Redis, behind a small header that says what every rank does next (train,
publish, stop). The other ranks run the followers' loop (`_follow`): receive, do as the header says. What both
do together (training, the stop vote, checkpoints, the metrics row) is `RankSteps`, learner/steps.py.

Stalls: the followers wait for rank 0 inside collectives, which fail after `learner.collective_timeout_s`. Whenever
rank 0 works or waits alone (a batch while generation stalls, the evaluations, a weight-sync group that engines join,
the engines' acks, its Redis writes after a step and a checkpoint, which wait out a Redis outage of any length) it
sends a HOLD every 2 s that the followers answer by waiting again (`Hold`, learner/distributed.py;
`RankSteps.alone`), so a stall of any length restarts nothing.

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
import time
from collections.abc import Callable, Iterable

import torch

from buffer.codec import decode_group
from learner.coordinator import StepCoordinator, WeightSink
from learner.distributed import World, broadcast_frames, receive_frames, wait_while_held
from learner.job import LearnerJob
from learner.model import DTYPES
from learner.steps import RankSteps, StepHooks
from learner.stop import StopFlag
from weight_sync.publisher import gather_in_step


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
    steps = RankSteps(job, world, resume=resume, stop=stop or StopFlag())
    publish_dtype = DTYPES[job.model.dtype]
    try:
        if world.is_main:
            vocab_size = steps.learner.model.config.vocab_size
            # Redis calls (acks, recalls) that may ride out an outage: the followers are held meanwhile
            coordinator = steps.alone(
                lambda: StepCoordinator(job, steps.state, prompts, resume, vocab_size, steps.stop)
            )
            try:
                _coordinate(steps, coordinator, publish_dtype, weight_sink)
            finally:
                coordinator.close()
        else:
            steps.alone(lambda: None)  # rank 0 starts its coordinator meanwhile
            _follow(steps, publish_dtype)
    finally:
        steps.close()
    return steps.version


def _coordinate(
    steps: RankSteps,
    coordinator: StepCoordinator,
    publish_dtype: torch.dtype,
    weight_sink: WeightSink | None,
) -> None:
    """Rank 0's loop: take each batch from the buffer, tell every rank what to do with it, and do it too."""
    learner, world, hold = steps.learner, steps.world, steps.hold

    def publish(before: Callable[[], None] = lambda: None, after: Callable[[], None] = lambda: None) -> dict:
        """Publish the weights; `before` and `after` (a step's bookkeeping) ride in the holds around the gathers."""

        def prepare() -> None:
            before()
            coordinator.prepare_publish()  # engines join a new weight-sync group

        def confirm() -> dict:
            acked = coordinator.confirm_publish(learner.version)  # the engines' acks, then the version
            after()
            return acked

        hold.run(prepare)  # the followers are held meanwhile
        extras = learner.publish_extras()  # LoRA's adapter config and the probe (collective: every rank)
        stats = coordinator.publish(
            learner.published_weights(), learner.version, publish_dtype, weight_sink, **extras
        )
        return stats | hold.run(confirm)

    published = steps.agree_on_version(coordinator.found_version)
    checkpoint = steps.state.version if steps.has_checkpoint else None
    coordinator.explain_version(published, learner.version, checkpoint, steps.resume)
    publish()  # the engines get the learner's weights as the current version (a resume rolls them back to it)
    coordinator.mark_start(steps.mark_start(), steps.resumed.skipped)
    while not steps.done:
        # 1. take a batch of groups, tell every rank what comes next
        step_start = time.perf_counter()
        hold.start()  # however long the batch takes, the followers hear from this rank every 2 s
        taken = coordinator.next_batch(learner.version, beat=hold.beat)
        header = coordinator.step_header(taken, learner.version)
        payloads = [t.payload for t in taken] if header["command"] == "train" else []
        broadcast_frames([json.dumps(header).encode(), *payloads], world)
        if header["command"] == "stop":
            break
        if header["command"] == "publish":
            publish()  # engines joined or left while we waited: they get the current weights before they sample
            continue
        groups = [t.group for t in taken]  # decoded when they were taken
        wait_s = time.perf_counter() - step_start
        # 2. log-probs, loss, optimizer step; version + 1
        trained = steps.train(groups, header)
        # 3. publish the weights to every engine, then the version; before it, the staleness bound of releases from
        # the new version on; after it, the bookkeeping: staleness histogram, groups awaiting their ack (until the
        # checkpoint), the groups record
        published_metrics = publish(
            before=functools.partial(coordinator.bound_releases, learner.version, trained),
            after=functools.partial(coordinator.after_step, taken, learner.version, trained),
        )
        # 4. checkpoint, then ack what it made durable; the metrics row
        stopping = steps.finish_step(coordinator, groups, trained, published_metrics, step_start, wait_s)
        # 5. evaluations due at this version, and those answered since
        for result in steps.alone(lambda: coordinator.evaluations(learner.version, last=steps.done)):
            steps.tracker.log_eval(result, step=result["step"])
        if stopping:
            break
    steps.final_checkpoint(coordinator)
    if not steps.done:
        return
    # after the last step, until the evaluations still out are answered: an engine that missed the last publish (it
    # was evaluating with its weights pinned, restarting, or unreachable for `weight_sync.timeout_s`) can only
    # answer an evaluation of the final version once it holds that version, and nobody but this learner can give
    # it. So every rank re-forms the group and publishes the final weights again whenever the coordinator says so;
    # while it waits, the followers are held as during a batch's wait.
    hold.start()
    while True:
        command, answered = coordinator.settle()
        for result in answered:
            steps.tracker.log_eval(result, step=result["step"])
        if command == "wait":
            hold.beat()
        else:
            broadcast_frames([command.encode()], world)
            hold.start()
        if command == "publish":
            publish()
        elif command == "done":
            break


def _follow(steps: RankSteps, publish_dtype: torch.dtype) -> None:
    """The loop of every other rank: receive what the coordinator decided (and the batch), do it."""
    learner, world = steps.learner, steps.world
    hooks = StepHooks()  # a follower adds nothing of its own to the collective parts

    def publish() -> dict:
        wait_while_held(world)  # the coordinator forms the weight-sync group alone
        # take part in the coordinator's probe and gathers: same order, same wire dtype; only the coordinator sends
        learner.publish_extras()
        gather_in_step(learner.published_weights(), publish_dtype)
        wait_while_held(world)  # the coordinator waits for the engines' acks alone
        return {}

    steps.agree_on_version(0)  # only the coordinator reads the published version
    publish()
    steps.mark_start()
    while not steps.done:
        step_start = time.perf_counter()
        first, *payloads = receive_frames(world)  # held meanwhile while the coordinator waits for the batch
        header = json.loads(first)
        if header["command"] == "stop":
            break
        if header["command"] == "publish":
            publish()
            continue
        groups = [decode_group(p) for p in payloads]
        wait_s = time.perf_counter() - step_start
        trained = steps.train(groups, header)
        published_metrics = publish()
        stopping = steps.finish_step(hooks, groups, trained, published_metrics, step_start, wait_s)
        steps.alone(lambda: None)  # rank 0 asks for the evaluations due and reads those answered meanwhile
        if stopping:
            break
    steps.final_checkpoint(hooks)
    if not steps.done:
        return
    # settling after the last step (see `_coordinate`): publish the final weights again whenever told to
    while True:
        command = receive_frames(world)[0].decode()
        if command == "publish":
            publish()
        elif command == "done":
            break
