"""The asking side of evaluations during a run (`sr1 run`, the learner's rank 0): request one, wait, read reports."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from evaluation.report import EvaluationFailed, merge_answers

log = logging.getLogger(__name__)


class Evaluations:
    """The asking side of evaluations during a run (`sr1 run`, the learner's rank 0): ask for one at a version,
    split over the generator workers alive now; collect their reports; append each to `<run_dir>/evals.jsonl`.

        evals = Evaluations(buffer, cfg.eval, run_dir)
        evals.request(step=50)                      # the policy at version 50 or newer
        for report in evals.ready(): ...            # reports of evaluations answered since the last call
        result = evals.wait(evals.request(step=0), timeout_s=600)
    """

    def __init__(self, buffer: Any, cfg: Any, run_dir: Any | None):
        self.buffer = buffer
        self.cfg = cfg  # the `eval` section
        self.path = None if run_dir is None else Path(run_dir) / "evals.jsonl"
        self.pending: dict[str, int] = {}  # eval id -> step

    def answerers(self) -> list[dict[str, Any]]:
        """The generator workers alive now (those that answer evaluation shards)."""
        return [w for w in self.buffer.workers() if w.get("role") == "generator"]

    def request(self, step: int, version: int | None = None) -> str:
        eval_id = self.buffer.request_evaluation(
            step=step,
            version=step if version is None else version,
            shards=max(1, len(self.answerers())),
            max_prompts=self.cfg.max_prompts,
            max_per_source=self.cfg.max_per_source,
            greedy=True,
        )
        self.pending[eval_id] = step
        return eval_id

    def _finish(self, eval_id: str, answers: list[dict[str, Any]]) -> dict[str, Any]:
        """The merged result, recorded in evals.jsonl; EvaluationFailed (logged) when every shard failed. The
        answers leave Redis either way (they are read once: `pending` lives in this process only)."""
        step = self.pending.pop(eval_id)
        self.buffer.forget_evaluation(eval_id)
        try:
            result = {"step": step} | merge_answers(answers)
        except EvaluationFailed as err:
            log.warning("evaluation %s (step %d) failed: %s", eval_id, step, err)
            raise
        for error in {str(r["error"]) for r in answers if r.get("error")}:
            log.warning("evaluation %s (step %d): a shard failed: %s", eval_id, step, error)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps(result) + "\n")
        return result

    def ready(self) -> list[dict[str, Any]]:
        done = []
        for eval_id in list(self.pending):
            answers = self.buffer.evaluation_answers(eval_id)
            if answers is not None:
                with contextlib.suppress(EvaluationFailed):  # logged; training goes on without it
                    done.append(self._finish(eval_id, answers))
        return done

    def wait(self, eval_id: str, timeout_s: float, orphan_s: float = 60.0) -> dict[str, Any]:
        """Wait for one evaluation; give up (TimeoutError) after `timeout_s`, or once no generator worker has been
        alive for `orphan_s` (nobody is left to answer it)."""
        patience = Patience(self, timeout_s, orphan_s)
        while True:
            answers = self.buffer.evaluation_answers(eval_id)
            if answers is not None:
                return self._finish(eval_id, answers)
            if why := patience.exhausted():
                step = self.pending.pop(eval_id)
                raise TimeoutError(f"evaluation {eval_id} (step {step}) {why}")
            time.sleep(0.25)


class Patience:
    """How long whoever asked keeps waiting for evaluations: `timeout_s` from now, and no longer than `orphan_s` after
    a generator worker (an answerer) was last seen alive."""

    def __init__(self, evals: Evaluations, timeout_s: float, orphan_s: float = 60.0):
        self.evals, self.orphan_s = evals, orphan_s
        self.deadline = time.monotonic() + timeout_s
        self.answerer_seen = time.monotonic()

    def exhausted(self) -> str | None:
        """Why to stop waiting ("timed out", "no generator worker alive for N s"), or None to go on."""
        now = time.monotonic()
        if self.evals.answerers():
            self.answerer_seen = now
        if now > self.deadline:
            return "timed out"
        if now - self.answerer_seen > self.orphan_s:
            return f"no generator worker alive for {self.orphan_s:.0f} s"
        return None
