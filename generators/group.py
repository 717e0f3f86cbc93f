"""One GRPO group: the n samples of a prompt run concurrently through the agent loop, scored by the task and packed.

group, rollouts = await run_group(engine, prompt, task, tokenizer, settings, n=5, chat_template=True)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from buffer.records import Group, PromptRecord
from generators.agent import AgentSettings, Rollout, run_agent
from tasks import Task
from tasks.prompt_tokens import encode_prompt


async def run_group(
    engine: Any,
    prompt: PromptRecord,
    task: Task,
    tokenizer: Any,
    settings: AgentSettings,
    *,
    n: int,
    chat_template: bool = True,
    max_prompt_tokens: int | None = None,
    worker_id: str = "",
    prompt_ids: list[int] | None = None,
    on_rollout_done: Callable[[Rollout], None] | None = None,
) -> tuple[Group, list[Rollout]]:
    """Run the n samples of `prompt` at once (the engine batches them, prefix caching shares the prompt)."""
    if prompt_ids is None:
        prompt_ids = encode_prompt(tokenizer, prompt.prompt, chat_template=chat_template)
    if max_prompt_tokens is not None and len(prompt_ids) > max_prompt_tokens:
        # nothing is sampled; the group still goes out (reward 0 everywhere, zero advantage) so the prompt is done
        rollouts = [Rollout(prompt_ids=list(prompt_ids), finish_reason="prompt_too_long") for _ in range(n)]
        for rollout in rollouts:
            if on_rollout_done is not None:
                on_rollout_done(rollout)
    else:

        async def one() -> Rollout:
            rollout = await run_agent(engine, prompt_ids, task, tokenizer, settings)
            if on_rollout_done is not None:
                on_rollout_done(rollout)  # as each one ends: its engine slot is free for another group
            return rollout

        rollouts = list(await asyncio.gather(*(one() for _ in range(n))))
    trajectories = []
    for rollout in rollouts:
        score = task.score(rollout, prompt.ground_truth)
        trajectories.append(rollout.to_trajectory(score.reward, score.metrics))
    group = Group(
        group_id=prompt.group_id,
        data_source=prompt.data_source,
        index=prompt.index,
        trajectories=trajectories,
        ground_truth=list(prompt.ground_truth),
        question=prompt.question,
        worker_id=worker_id,
        created_at=time.time(),
        release_version=prompt.release_version,
    )
    return group, rollouts
