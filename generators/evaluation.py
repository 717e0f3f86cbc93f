"""The generators' side of evaluation: answer a shard of test prompts with the agent loop (see `evaluation/`), and
answer the learner's evaluation requests from the buffer with it.

    report = await answer_shard(engine, prompts, task, tokenizer, cfg.generators, max_model_len=512)
    report["eval/em"], report["eval/em/nq"], report["eval/tool_calls_per_traj"], report["eval/n"]

    answerer = EvaluationAnswerer(cfg.generators, buffer, engine, tokenizer, task, worker_id="gen-0",
                                  weights=weights, telemetry=telemetry, prompts=test_prompts, max_model_len=512)
    await answerer.answer_requests()    # a generator worker's background loop (buffer/evaluations.py's requests)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from buffer.connection import REDIS_ERROR
from buffer.records import PromptRecord
from buffer.redis_buffer import ReplayBuffer
from evaluation import compact_item, select_prompts, shard, summarize
from generators.agent import AgentSettings, run_agent
from generators.settings import GeneratorsConfig
from generators.telemetry import WorkerTelemetry
from generators.weight_following import WeightFollower
from tasks import Task
from tasks.prompt_tokens import encode_prompt

log = logging.getLogger(__name__)


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


class EvaluationAnswerer:
    """Answers a worker's share of the learner's evaluation requests on the test prompts, with pinned weights."""

    def __init__(
        self,
        cfg: GeneratorsConfig,
        buffer: ReplayBuffer,
        engine: Any,
        tokenizer: Any,
        task: Task,
        *,
        worker_id: str,
        weights: WeightFollower,
        telemetry: WorkerTelemetry,
        prompts: Callable[[], list[PromptRecord]] | None,  # every test prompt; None: answer no request
        max_model_len: int,
        max_turns: int | None = None,
        seed: int = 0,  # which prompts a stratified evaluation samples (the same for every shard)
        chat_template: bool = True,
    ):
        self.cfg = cfg
        self.buffer = buffer
        self.engine = engine
        self.tokenizer = tokenizer
        self.task = task
        self.worker_id = worker_id
        self.weights = weights
        self.telemetry = telemetry
        self.prompts = prompts
        self.max_model_len = max_model_len
        self.max_turns = max_turns
        self.seed = seed
        self.chat_template = chat_template

    async def answer_requests(self) -> None:
        """Answer evaluation requests (buffer/evaluations.py) on the test prompts. A request that cannot be answered
        (a bad field, unreadable test prompts, an engine error) is answered with an error record and counted; a
        Redis outage is waited out. Only an unexpected failure of the loop itself ends the worker."""
        if self.prompts is None:
            return
        while True:
            await asyncio.sleep(1.0)
            try:
                request = await asyncio.to_thread(self.buffer.pop_evaluation_request, self.worker_id)
            except ValueError as exc:  # malformed (no id to answer to): counted by the buffer and dropped
                self.telemetry.eval_errors += 1
                log.warning("%s", exc)
                continue
            except REDIS_ERROR as exc:
                log.warning("evaluation requests: %s; trying again", exc)
                continue
            if request is None:
                continue
            try:
                await self._answer(request)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.telemetry.eval_errors += 1
                log.exception(
                    "worker %s: evaluation request %s failed; answering with the error",
                    self.worker_id,
                    request.get("id"),
                )
                error = {
                    "error": f"{type(exc).__name__}: {exc}"[:1000],
                    "items": [],
                    "step": request.get("step"),
                    "eval/version": int(self.engine.version),
                    "worker_id": self.worker_id,
                }
                with contextlib.suppress(REDIS_ERROR):  # else it is re-queued when this worker restarts
                    await asyncio.to_thread(self.buffer.post_evaluation_answer, request, error)

    async def _answer(self, request: dict[str, Any]) -> None:
        """Answer one shard of an evaluation at the requested version or a newer one, with the engine's weights
        pinned throughout: it leaves the weight-sync group for the evaluation (no update lands mid-way) and rejoins
        after. Posts the shard's items; whoever asked merges the shards (`evaluation.merge_answers`)."""
        wanted = int(request.get("version", 0))
        published = await asyncio.to_thread(self.buffer.version)
        if wanted > published:
            raise ValueError(
                f"the request asks for version {wanted}, but the learner has published only {published}"
            )
        while int(self.engine.version) < wanted:  # a restarted engine waits for the learner's weights first
            await asyncio.sleep(self.cfg.weight_sync_poll_s)
        index, count = request.get("shard", (0, 1))
        selected = select_prompts(
            self.prompts(),
            max_prompts=request.get("max_prompts"),
            max_per_source=request.get("max_per_source"),
            seed=self.seed,
        )
        async with self.weights.pinned_weights():
            version = int(self.engine.version)
            started = time.monotonic()
            result = await answer_shard(
                self.engine,
                shard(selected, int(index), int(count)),
                self.task,
                self.tokenizer,
                self.cfg,
                greedy=bool(request.get("greedy", True)),
                samples=int(request.get("samples", 1)),
                max_model_len=self.max_model_len,
                max_turns=self.max_turns,
                chat_template=self.chat_template,
                return_items=True,
            )
        answer = {
            "items": [compact_item(item) for item in result["items"]],
            "eval/seconds": time.monotonic() - started,
            "eval/version": version,
            "step": request.get("step"),
            "worker_id": self.worker_id,
        }
        await asyncio.to_thread(self.buffer.post_evaluation_answer, request, answer)
