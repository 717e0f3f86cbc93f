"""Evaluation: the agent loop once (or `samples` times) per test prompt, the task's metrics overall and per source.

    prompts = select_prompts(test_prompts, max_prompts=1000, seed=0)     # stratified over data sources
    result = await evaluate(engine, prompts, task, tokenizer, cfg.generators, max_model_len=512)
    result["eval/em"], result["eval/em/nq"], result["eval/tool_calls_per_traj"], result["eval/n"]

Every number the task's `score` reports (Search-R1: `em`, `f1`, `substring_em`, `well_formed`) is averaged into
`eval/<metric>` and, per data source, `eval/<metric>/<source>`; `eval/reward` is the mean reward. With `samples` k > 1
each prompt is answered k times and `eval/pass@k/<metric>` counts a prompt as solved when any sample scores 1.

An evaluation can be split over several workers (`shard`): each answers every k-th selected prompt and returns its
items, and `merge_shards` summarizes them as if one worker had answered all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from buffer.records import PromptRecord
from generators.agent import FINISH_REASONS, AgentSettings, run_agent
from generators.settings import GeneratorsConfig
from tasks import Task
from tasks.prompt_tokens import encode_prompt

log = logging.getLogger(__name__)

# what an item keeps when it travels through Redis (a training-time evaluation of thousands of prompts)
COMPACT_FIELDS = ("group_id", "data_source", "sample", "metrics", "tool_calls", "turns", "finish_reason")


def select_prompts(prompts: Sequence[PromptRecord], *, max_prompts: int | None = None,
                   max_per_source: int | None = None, seed: int = 0) -> list[PromptRecord]:  # fmt: skip
    """The evaluation set: every prompt, or a sample stratified over data sources.

    `max_per_source` keeps at most that many prompts of each source. `max_prompts` caps the total, shared equally
    between sources (a source with fewer prompts gives its unused share to the others), so a test file that lists
    NQ first is not measured on NQ alone. Which prompts of a source are kept is a seeded random choice (the same on
    every machine); the result keeps the file order.
    """
    by_source: dict[str, list[int]] = defaultdict(list)
    for i, prompt in enumerate(prompts):
        by_source[prompt.data_source].append(i)
    quota = {
        s: len(ix) if max_per_source is None else min(len(ix), max_per_source) for s, ix in by_source.items()
    }
    if max_prompts is not None and sum(quota.values()) > max_prompts:
        quota = _share_equally(quota, max_prompts)
    rng = np.random.Generator(np.random.PCG64(seed))
    kept: list[int] = []
    for source in sorted(
        by_source
    ):  # sorted: the draw does not depend on which source comes first in the file
        indices = by_source[source]
        chosen = (
            indices if quota[source] == len(indices) else rng.choice(indices, quota[source], replace=False)
        )
        kept.extend(int(i) for i in chosen)
    return [prompts[i] for i in sorted(kept)]


def _share_equally(available: dict[str, int], total: int) -> dict[str, int]:
    """Water-filling: each source gets total / sources, capped at what it has; leftovers go to the others."""
    share = dict.fromkeys(available, 0)
    left = total
    open_sources = sorted(available)
    while left > 0 and open_sources:
        each, extra = divmod(left, len(open_sources))
        for k, source in enumerate(open_sources):
            give = min(each + (1 if k < extra else 0), available[source] - share[source])
            share[source] += give
            left -= give
        open_sources = [s for s in open_sources if share[s] < available[s]]
    return share


def shard(prompts: Sequence[PromptRecord], index: int, count: int) -> list[PromptRecord]:
    """The prompts worker `index` of `count` answers."""
    if not 0 <= index < count:
        raise ValueError(f"shard {index} of {count} does not exist")
    return list(prompts[index::count])


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}


def summarize(items: list[dict[str, Any]]) -> dict[str, float]:
    """Means over evaluated items: overall and per data source, for the reward and every numeric task metric; the
    share of each finish reason; pass@k when prompts were sampled several times."""
    n = len(items)
    out: dict[str, float] = {"eval/n": n}
    if not n:
        return out
    out["eval/tool_calls_per_traj"] = sum(i["tool_calls"] for i in items) / n
    out["eval/turns_mean"] = sum(i["turns"] for i in items) / n
    reasons = Counter(i["finish_reason"] for i in items)
    for reason in sorted(set(FINISH_REASONS) | set(reasons)):
        out[f"eval/finish/{reason}"] = reasons[reason] / n
    by_source: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for item in items:
        by_source[item["data_source"]].append(item)
    names = sorted({k for item in items for k in item["metrics"]})
    for name in names:
        out[f"eval/{name}"] = sum(i["metrics"].get(name, 0.0) for i in items) / n
    for source, rows in sorted(by_source.items()):
        for name in names:
            out[f"eval/{name}/{source}"] = sum(r["metrics"].get(name, 0.0) for r in rows) / len(rows)
        out[f"eval/tool_calls_per_traj/{source}"] = sum(r["tool_calls"] for r in rows) / len(rows)
        out[f"eval/n/{source}"] = len(rows)
    samples = max(int(i.get("sample", 0)) for i in items) + 1
    if samples > 1:
        out |= _pass_at_k(items, names, samples)
    return out


def _pass_at_k(items: list[dict[str, Any]], names: list[str], k: int) -> dict[str, float]:
    """A prompt counts as solved for a metric when any of its k samples scores 1 on it."""
    best: dict[str, dict[str, float]] = defaultdict(dict)
    source_of: dict[str, str] = {}
    for item in items:
        source_of[item["group_id"]] = item["data_source"]
        for name in names:
            value = item["metrics"].get(name, 0.0)
            best[item["group_id"]][name] = max(best[item["group_id"]].get(name, 0.0), value)
    out: dict[str, float] = {"eval/samples": k}
    for name in names:
        solved = [float(b.get(name, 0.0) >= 1.0) for b in best.values()]
        out[f"eval/pass@{k}/{name}"] = sum(solved) / len(solved)
        for source in sorted(set(source_of.values())):
            rows = [float(b.get(name, 0.0) >= 1.0) for g, b in best.items() if source_of[g] == source]
            out[f"eval/pass@{k}/{name}/{source}"] = sum(rows) / len(rows)
    return out


class EvaluationFailed(RuntimeError):
    """Every shard of an evaluation was answered with an error (a bad request, unreadable test data, an engine
    error): there is nothing to summarize."""


def merge_shards(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One summary from the results of every shard of an evaluation (each holds its `items`). Shards a worker
    answered with an `error` are left out and counted (`eval/failed_shards`); if all failed, EvaluationFailed."""
    errors = [str(r["error"]) for r in results if r.get("error")]
    if len(errors) == len(results):
        raise EvaluationFailed("every shard failed: " + "; ".join(sorted(set(errors))))
    results = [r for r in results if not r.get("error")]
    items = [item for result in results for item in result["items"]]
    versions = [int(r["eval/version"]) for r in results]
    return summarize(items) | {
        "eval/failed_shards": len(errors),
        "eval/version": min(versions),
        "eval/version_max": max(
            versions
        ),  # shards pin their own engine; all hold at least the requested version
        "eval/seconds": max(float(r.get("eval/seconds", 0.0)) for r in results),
        "eval/workers": len(results),
    }


async def evaluate(
    engine: Any,
    prompts: list[PromptRecord],
    task: Task,
    tokenizer: Any,
    cfg: GeneratorsConfig,
    *,
    greedy: bool = True,
    samples: int = 1,
    max_model_len: int | None = None,
    max_turns: int | None = None,
    chat_template: bool = True,
    return_items: bool = False,
    on_item: Callable[[dict[str, Any]], None] | None = None,
    concurrency: int = 256,
) -> dict[str, Any]:
    """Run each prompt `samples` times (greedy by default); returns `summarize` of the items plus `eval/version`.

    `max_model_len` defaults to the engine's configured length; `max_turns` overrides the tool-call limit (0: one
    turn that must answer, as the direct and RAG baselines do); `on_item` is called as each item finishes.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if greedy and samples > 1:
        raise ValueError(
            "several samples of a greedy evaluation would all be the same: sample (greedy=False)"
        )
    if max_model_len is None:
        max_model_len = cfg.engine.max_model_len or 1 << 30
    settings = AgentSettings.from_config(cfg, max_model_len, max_turns=max_turns)
    limit = asyncio.Semaphore(concurrency)

    async def one(prompt: PromptRecord, sample: int) -> dict[str, Any]:
        async with limit:
            ids = encode_prompt(tokenizer, prompt.prompt, chat_template=chat_template)
            rollout = await run_agent(engine, ids, task, tokenizer, settings, greedy=greedy, logprobs=False)
        score = task.score(rollout, prompt.ground_truth)
        item = {
            "group_id": prompt.group_id,
            "data_source": prompt.data_source,
            "sample": sample,
            "question": prompt.question,
            "ground_truth": list(prompt.ground_truth),
            "reward": score.reward,
            "metrics": {"reward": score.reward} | _numbers(score.metrics),
            "answer": score.metrics.get("answer"),
            "tool_calls": rollout.tool_calls,
            "turns": rollout.turns,
            "finish_reason": rollout.finish_reason,
            "tool_inputs": rollout.tool_inputs,
            "response": rollout.model_text,
        }
        if on_item is not None:
            on_item(item)
        return item

    items = list(await asyncio.gather(*(one(p, s) for p in prompts for s in range(samples))))
    out: dict[str, Any] = summarize(items) | {"eval/version": int(getattr(engine, "version", 0))}
    if return_items:
        out["items"] = items
    return out


def compact(item: dict[str, Any]) -> dict[str, Any]:
    """What `merge_shards` needs of an item (no texts)."""
    return {k: item[k] for k in COMPACT_FIELDS}


class Evaluations:
    """The asking side of evaluations during a run (`sr1 run`, the learner's rank 0): ask for one at a version,
    split over the generator workers alive now; collect the merged results; append each to `<run_dir>/evals.jsonl`.

        evals = Evaluations(buffer, cfg.eval, run_dir)
        evals.request(step=50)                      # the policy at version 50 or newer
        for result in evals.ready(): ...            # merged results that came in since the last call
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

    def _finish(self, eval_id: str, results: list[dict[str, Any]]) -> dict[str, Any]:
        """The merged result, recorded in evals.jsonl; EvaluationFailed (logged) when every shard failed."""
        step = self.pending.pop(eval_id)
        try:
            result = {"step": step} | merge_shards(results)
        except EvaluationFailed as err:
            log.warning("evaluation %s (step %d) failed: %s", eval_id, step, err)
            raise
        for error in {str(r["error"]) for r in results if r.get("error")}:
            log.warning("evaluation %s (step %d): a shard failed: %s", eval_id, step, error)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps(result) + "\n")
        return result

    def ready(self) -> list[dict[str, Any]]:
        done = []
        for eval_id in list(self.pending):
            results = self.buffer.evaluation_results(eval_id)
            if results is not None:
                with contextlib.suppress(EvaluationFailed):  # logged; training goes on without it
                    done.append(self._finish(eval_id, results))
        return done

    def wait(self, eval_id: str, timeout_s: float, orphan_s: float = 60.0) -> dict[str, Any]:
        """Wait for one evaluation; give up (TimeoutError) after `timeout_s`, or once no generator worker has been
        alive for `orphan_s` (nobody is left to answer it)."""
        patience = Patience(self, timeout_s, orphan_s)
        while True:
            results = self.buffer.evaluation_results(eval_id)
            if results is not None:
                return self._finish(eval_id, results)
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


def read_evals(run_dir: Any) -> list[dict[str, Any]]:
    """The evaluations a run recorded (`evals.jsonl`), oldest first; a torn last line is skipped."""
    path = Path(run_dir) / "evals.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
