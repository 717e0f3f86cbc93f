"""Evaluation: one vocabulary for `sr1 eval`, the learner's periodic evaluations and the generators that answer them.

- a **request** asks for the policy at version v or newer to be measured on the test prompts
  (`Evaluations.request`; it travels through Redis as `buffer/evaluations.py` describes);
- a **shard** is the share of the selected prompts one generator worker answers (`select_prompts`, `shard`);
- an **answer** is one shard's items, one per prompt and sample, posted back by the worker that answered it
  (`generators/evaluation.py` runs the agent loop on a shard; `compact_item` is what an item keeps in Redis);
- a **report** is the summary of every answer: the task's metrics overall and per data source (`merge_answers`,
  `summarize`), appended to `<run_dir>/evals.jsonl` during a run, written as a table and a plot by `sr1 eval`.

    prompts = select_prompts(test_prompts, max_prompts=1000, seed=0)      # stratified over data sources
    evals = Evaluations(buffer, cfg.eval, run_dir)                         # the asking side (learner rank 0)
    report = evals.wait(evals.request(step=50), timeout_s=600)            # report["eval/em"], report["eval/em/nq"]

This package never runs a model: the learner asks and reads reports without importing the generators, and the
generators answer without importing the learner.
"""

from evaluation.asking import Evaluations, Patience
from evaluation.prompts import select_prompts, shard
from evaluation.report import (
    COMPACT_FIELDS,
    EvaluationFailed,
    compact_item,
    merge_answers,
    read_evals,
    summarize,
)

__all__ = [
    "COMPACT_FIELDS",
    "EvaluationFailed",
    "Evaluations",
    "Patience",
    "compact_item",
    "merge_answers",
    "read_evals",
    "select_prompts",
    "shard",
    "summarize",
]
