"""What the learner does when a checkpoint cannot be written (a full disk, an I/O error).

A checkpoint is a safety net, not a reason to stop training: after one failed save the run goes on (its groups
stay unacked until a later checkpoint holds them), and only when the next one fails too does the learner stop,
saying how much space it needs and how to go on. The last checkpoint of a run (at `learner.total_steps`) is
different: the weights exist nowhere else, so it is retried until it succeeds or the learner is asked to stop.

    net = SafetyNet(checkpointer, last_good=4)
    net.failed(err, version=8, model=model)    # logs; raises CheckpointsFailing on the second failure in a row
    net.saved(version=12)
    net.metrics()                              # checkpoint/failed_in_a_row, checkpoint/last_good_step
"""

from __future__ import annotations

import logging
import shutil

from learner.checkpoints.checkpointer import Checkpointer, CheckpointWriteError

log = logging.getLogger(__name__)

MAX_FAILURES_IN_A_ROW = 2
FINAL_RETRY_S = (10.0, 20.0, 40.0, 60.0)  # waits between tries of the last checkpoint (then 60 s each)


class CheckpointsFailing(RuntimeError):
    """Checkpoints cannot be written: two in a row failed mid-run, or the last one of the run failed and the learner
    was asked to stop. The learner exits with `config.EXIT_CHECKPOINT_FAILED`, which supervisors do not restart."""


def _size(size: float) -> str:
    return f"{size / 1e9:.1f} GB" if size >= 1e9 else f"{size / 1e6:.0f} MB"


class SafetyNet:
    def __init__(self, checkpointer: Checkpointer, last_good: int | None):
        self.checkpointer = checkpointer
        self.last_good = last_good
        self.failed_steps: list[int] = []  # steps whose checkpoint failed since the last good one
        self.last_failure = ""  # the last failure, the space it needs, what to do

    @property
    def failed_in_a_row(self) -> int:
        return len(self.failed_steps)

    def saved(self, version: int) -> None:
        if self.failed_steps:
            log.info(
                "checkpoint step_%d written: the groups trained since step %s are durable again",
                version,
                self.last_good if self.last_good is not None else "0 (the initial weights)",
            )
        self.last_good = version
        self.failed_steps = []

    def metrics(self) -> dict[str, float]:
        return {
            "checkpoint/failed_in_a_row": float(self.failed_in_a_row),
            "checkpoint/last_good_step": float(self.last_good or 0),
        }

    def failed(self, err: CheckpointWriteError, version: int, model, *, last: bool = False) -> None:
        """Record that the checkpoint of `version` failed; raise CheckpointsFailing when it is the second in a row
        (mid-run; `last`: the run's final checkpoint, which the caller retries instead)."""
        self.failed_steps.append(version)
        state = self.state(err, model)
        if self.failed_in_a_row >= MAX_FAILURES_IN_A_ROW and not last:
            steps = ", ".join(f"step {v}" for v in self.failed_steps)
            fix = "Free space there (or lower learner.keep_checkpoints), then" if err.no_space else "Then"
            self.last_failure = (
                f"{self.failed_in_a_row} checkpoints in a row could not be written ({steps}): {err}. Stopping "
                f"before more training goes without a checkpoint. {state} {fix} resume the run with --resume: it "
                "goes on from the last good checkpoint, and the groups trained since are generated again."
            )
            raise CheckpointsFailing(self.last_failure)
        then = (
            "It is tried again until it is written."
            if last
            else "Training goes on; the next checkpoint is tried in learner.checkpoint_every steps, and a second "
            "failure in a row stops the run."
        )
        self.last_failure = f"{err}. {state}"
        log.error("checkpoint step_%d failed: %s. %s %s", version, err, state, then)

    def state(self, err: CheckpointWriteError, model) -> str:
        """The last good checkpoint, and for a full disk how much space the next one needs and how much is free."""
        root = self.checkpointer.root
        good = (
            f"The last good checkpoint is step_{self.last_good}."
            if self.last_good is not None
            else "There is no good checkpoint yet (a resume starts from the initial weights)."
        )
        if not err.no_space:
            return f"{good} Fix the storage under {root}."
        needed, source = self.checkpointer.space_needed(model)
        try:
            free = f"{_size(shutil.disk_usage(root).free)} is free there now"
        except OSError:
            free = "its free space is unknown"
        return (
            f"{good} The next checkpoint needs about {_size(needed)} free under {root} ({source}; the "
            f"{self.checkpointer.keep} kept by learner.keep_checkpoints stay until it is written), and {free}."
        )
