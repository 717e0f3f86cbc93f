"""The generators' side of evaluation: answer a shard of test prompts with the agent loop (see `evaluation/`).

report = await answer_shard(engine, prompts, task, tokenizer, cfg.generators, max_model_len=512)
report["eval/em"], report["eval/em/nq"], report["eval/tool_calls_per_traj"], report["eval/n"]
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from buffer.records import PromptRecord
from evaluation.report import summarize
from generators.agent import AgentSettings, run_agent
from generators.settings import GeneratorsConfig
from tasks import Task
from tasks.prompt_tokens import encode_prompt


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}


async def answer_shard(
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
