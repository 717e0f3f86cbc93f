"""Evaluation: the agent loop once per test prompt (greedy by default), the task's metrics overall and per source.

    result = await evaluate(engine, prompts, task, tokenizer, cfg.generators, max_model_len=512)
    result["eval/em"], result["eval/em/nq"], result["eval/tool_calls_per_traj"], result["eval/n"]

Every number the task's `score` reports (Search-R1: `em`, `f1`, `substring_em`, `well_formed`) is averaged into
`eval/<metric>` and, per data source, `eval/<metric>/<source>`; `eval/reward` is the mean reward.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from buffer.records import PromptRecord
from generators.agent import AgentSettings, encode_prompt, run_agent
from generators.settings import GeneratorsConfig
from tasks import Task


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}


def summarize(items: list[dict[str, Any]]) -> dict[str, float]:
    """Means over evaluated items: overall and per data source, for the reward and every numeric task metric."""
    n = len(items)
    out: dict[str, float] = {"eval/n": n}
    if not n:
        return out
    out["eval/tool_calls_per_traj"] = sum(i["tool_calls"] for i in items) / n
    out["eval/turns_mean"] = sum(i["turns"] for i in items) / n
    by_source: dict[str, list[dict[str, float]]] = defaultdict(list)
    for item in items:
        by_source[item["data_source"]].append(item["metrics"])
    names = sorted({k for item in items for k in item["metrics"]})
    for name in names:
        out[f"eval/{name}"] = sum(i["metrics"].get(name, 0.0) for i in items) / n
    for source, rows in sorted(by_source.items()):
        for name in names:
            out[f"eval/{name}/{source}"] = sum(r.get(name, 0.0) for r in rows) / len(rows)
    return out


async def evaluate(
    engine: Any,
    prompts: list[PromptRecord],
    task: Task,
    tokenizer: Any,
    cfg: GeneratorsConfig,
    *,
    greedy: bool = True,
    max_model_len: int | None = None,
    max_turns: int | None = None,
    chat_template: bool = True,
    return_items: bool = False,
    concurrency: int = 256,
) -> dict[str, Any]:
    """Run each prompt once (greedy by default); returns `summarize` of the items plus `eval/version`.

    `max_model_len` defaults to the engine's configured length.
    """
    if max_model_len is None:
        max_model_len = cfg.engine.max_model_len or 1 << 30
    settings = AgentSettings.from_config(cfg, max_model_len, max_turns=max_turns)
    limit = asyncio.Semaphore(concurrency)

    async def one(prompt: PromptRecord) -> dict[str, Any]:
        async with limit:
            ids = encode_prompt(tokenizer, prompt.prompt, chat_template=chat_template)
            rollout = await run_agent(engine, ids, task, tokenizer, settings, greedy=greedy, logprobs=False)
        score = task.score(rollout, prompt.ground_truth)
        return {
            "group_id": prompt.group_id,
            "data_source": prompt.data_source,
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

    items = list(await asyncio.gather(*(one(p) for p in prompts)))
    out: dict[str, Any] = summarize(items) | {"eval/version": int(getattr(engine, "version", 0))}
    if return_items:
        out["items"] = items
    return out
