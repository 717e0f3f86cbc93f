"""A generator worker: one engine kept full of agent trajectories of the task, streaming finished groups to Redis.

    worker = GeneratorWorker(job.generators, buffer, engine, tokenizer, task, worker_id="gen-0", max_model_len=512)
    await worker.run()          # until request_stop(); the process around it is generators/process.py

It composes the worker's parts and runs them side by side:

- claims.py             claim prompts (leases renewed while they run), run each group's n samples, put the group
- weight_following.py   join the learner's weight-sync group when a rendezvous appears, apply every newer update
- evaluation.py         answer evaluation requests on the test prompts, with the weights pinned
- tool_health.py        pause sampling while the tool keeps failing; probe it and resume
- telemetry.py          the counts and rates the worker heartbeats

On stop it stops claiming, finishes what it holds within `generators.drain_timeout_s`, releases the rest to other
workers and returns 0. A background loop that dies stops the worker, and `run` raises (its supervisor restarts it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Any

from buffer.redis_buffer import ReplayBuffer
from generators.agent import AgentSettings
from generators.claims import PromptClaims
from generators.evaluation import EvaluationAnswerer
from generators.settings import GeneratorsConfig
from generators.telemetry import ROLE, WorkerTelemetry, heartbeat_loop
from generators.tool_health import ToolHealth
from generators.weight_following import WeightFollower
from tasks import Task

log = logging.getLogger(__name__)


class GeneratorWorker:
    """Owns an engine, a tokenizer, a task and a buffer; `await run()` until `request_stop()`."""

    def __init__(
        self,
        cfg: GeneratorsConfig,
        buffer: ReplayBuffer,
        engine: Any,
        tokenizer: Any,
        task: Task,
        *,
        worker_id: str,
        max_model_len: int,
        max_prompt_tokens: int | None = None,
        chat_template: bool = True,
        eval_prompts: Any = None,  # callable() -> every test PromptRecord, for evaluation requests
        eval_max_turns: int | None = None,
        eval_seed: int = 0,  # which prompts a stratified evaluation samples (the same for every shard)
    ):
        self.cfg = cfg
        self.buffer = buffer
        self.engine = engine
        self.worker_id = worker_id
        self._stop = asyncio.Event()
        self._background_error: BaseException | None = None
        self.tools = ToolHealth(cfg.tool_pause)
        self.telemetry = WorkerTelemetry(engine, self.tools)
        self.weights = WeightFollower(cfg, buffer, engine, worker_id=worker_id)
        self.claims = PromptClaims(
            cfg,
            buffer,
            engine,
            tokenizer,
            task,
            AgentSettings.from_config(cfg, max_model_len),
            worker_id=worker_id,
            tools=self.tools,
            telemetry=self.telemetry,
            stop=self._stop,
            max_prompt_tokens=max_prompt_tokens,
            chat_template=chat_template,
        )
        self.evaluations = EvaluationAnswerer(
            cfg,
            buffer,
            engine,
            tokenizer,
            task,
            worker_id=worker_id,
            weights=self.weights,
            telemetry=self.telemetry,
            prompts=eval_prompts,
            max_model_len=max_model_len,
            max_turns=eval_max_turns,
            seed=eval_seed,
            chat_template=chat_template,
        )
        self._held = self.claims.held  # the prompts held now, by buffer entry id
        # the loops `run` starts beside the claims, named as their tasks are (a test may replace one)
        self._lease_loop = self.claims.lease_loop
        self._heartbeat_loop = functools.partial(
            heartbeat_loop, buffer, worker_id, self.metrics, cfg.heartbeat_s
        )
        self._weight_sync_loop = self.weights.follow
        self._eval_loop = self.evaluations.answer_requests
        self._tool_probe_loop = functools.partial(self.tools.probe_loop, task, worker_id)

    # what the worker has done so far (counted in `telemetry`, reported by its heartbeat)
    groups_done = property(lambda self: self.telemetry.groups_done)
    groups_failed = property(lambda self: self.telemetry.groups_failed)
    trajectories_done = property(lambda self: self.telemetry.trajectories_done)
    inflight_trajectories = property(lambda self: self.telemetry.inflight_trajectories)
    tool_calls = property(lambda self: self.telemetry.tool_calls)
    eval_errors = property(lambda self: self.telemetry.eval_errors)
    finish_reasons = property(lambda self: self.telemetry.finish_reasons)

    def request_stop(self) -> None:
        if not self._stop.is_set():
            log.info(
                "worker %s: stopping (no new claims, draining %d group(s))", self.worker_id, len(self._held)
            )
        self._stop.set()
        self.claims.wake()

    async def run(self) -> int:
        """Claim, generate and push until stopped; then drain, release and return 0."""
        # prompts and evaluation requests this worker id held in an earlier life (it was killed and restarted):
        # give them back at once instead of letting their leases expire
        earlier = await asyncio.to_thread(self.buffer.leased_by, self.worker_id)
        await asyncio.to_thread(self.buffer.release_claims, self.worker_id, earlier)
        await asyncio.to_thread(self.buffer.requeue_evaluations, self.worker_id)
        background = [
            asyncio.create_task(self._lease_loop(), name="leases"),
            asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
            asyncio.create_task(self._weight_sync_loop(), name="weight-sync"),
            asyncio.create_task(self._eval_loop(), name="eval"),
            asyncio.create_task(self._tool_probe_loop(), name="tool-probe"),
        ]
        for task in background:
            task.add_done_callback(self._background_done)
        try:
            await self.claims.claim_loop()
            await self.claims.drain()
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(
                    self.buffer.heartbeat, self.worker_id, ROLE, self.metrics() | {"rollout/state": "stopped"}
                )
        if self._background_error is not None:
            # the process exits with an error and its supervisor restarts it (a worker without, say, its
            # evaluation loop would keep heartbeating while the learner waits for answers that never come)
            raise RuntimeError(
                f"worker {self.worker_id}: {self._background_error}"
            ) from self._background_error
        return 0

    def _background_done(self, task: asyncio.Task) -> None:
        """A background loop ended: fine when cancelled or done by design (no weight sync, no test prompts);
        an exception is logged with its traceback and stops the worker, which then fails (see `run`)."""
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        log.error(
            "worker %s: background task %r died; stopping the worker",
            self.worker_id,
            task.get_name(),
            exc_info=(type(exc), exc, exc.__traceback__),
        )
        if self._background_error is None:
            self._background_error = RuntimeError(f"background task {task.get_name()!r} died: {exc!r}")
        self.request_stop()

    def _state(self) -> str:
        """What the heartbeat says the worker is doing: draining (stopping), paused (tool errors) or running."""
        if self._stop.is_set():
            return "draining"
        return "paused" if self.tools.paused else "running"

    def metrics(self) -> dict[str, Any]:
        return self.telemetry.metrics(
            inflight_groups=len(self._held), weight_sync_state=self.weights.state, state=self._state()
        )
