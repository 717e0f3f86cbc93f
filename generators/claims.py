"""Claiming prompts and running their groups: how a generator worker keeps its engine full.

    claims = PromptClaims(cfg, buffer, engine, tokenizer, task, settings, worker_id="gen-0", tools=tools,
                          telemetry=telemetry, stop=stop_event)
    await claims.claim_loop()       # until `stop` is set (call claims.wake() after setting it)
    await claims.drain()            # finish within generators.drain_timeout_s, release the rest
    # meanwhile, in the background: await claims.lease_loop()

It claims prompts from the buffer (leases, renewed while they run) while fewer than `generators.max_inflight_groups`
groups are held, runs the n samples of each group concurrently, and puts each group the moment it is complete. It
claims nothing while the engine is behind the published weights (a prompt is never sampled with weights older than
its release) or while the tool keeps failing (`tool_health.py`); a failed group's prompt goes back to the buffer.

Redis unreachable (a restart, a network cut) or full: every call retries for `buffer.reconnect_s`; past that the
worker keeps claiming and putting again (a put is idempotent), saying so, instead of dying with the groups it holds.
After a reconnect it gives back the prompts a claim whose reply was lost leased to it without its knowing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from buffer.connection import RETRIED as REDIS_UNAVAILABLE
from buffer.prompt_leases import ClaimedPrompt
from buffer.redis_buffer import ReplayBuffer
from buffer.staleness import may_sample
from generators.agent import AgentSettings, Rollout
from generators.group import run_group
from generators.settings import GeneratorsConfig
from generators.telemetry import WorkerTelemetry
from generators.tool_health import ToolHealth
from tasks import Task

log = logging.getLogger(__name__)


class PromptClaims:
    """The prompts one worker holds (`held`, by buffer entry id) and the groups running for them."""

    def __init__(
        self,
        cfg: GeneratorsConfig,
        buffer: ReplayBuffer,
        engine: Any,
        tokenizer: Any,
        task: Task,
        settings: AgentSettings,
        *,
        worker_id: str,
        tools: ToolHealth,
        telemetry: WorkerTelemetry,
        stop: asyncio.Event,
        max_prompt_tokens: int | None = None,
        chat_template: bool = True,
    ):
        self.cfg = cfg
        self.buffer = buffer
        self.engine = engine
        self.tokenizer = tokenizer
        self.task = task
        self.settings = settings
        self.worker_id = worker_id
        self.tools = tools
        self.telemetry = telemetry
        self.stop = stop
        self.max_prompt_tokens = max_prompt_tokens
        self.chat_template = chat_template
        self.held: dict[str, ClaimedPrompt] = {}
        self._tasks: set[asyncio.Task] = set()
        self._slot_free = asyncio.Event()
        self.waiting_for_weights = False  # the engine is behind the published version: no new claims
        self._reconnects = buffer.reconnects.count  # connection failures already looked after (orphan leases)

    def wake(self) -> None:
        """Wake the claim loop waiting for a free slot (it then sees `stop`)."""
        self._slot_free.set()

    async def _holds_published_weights(self) -> bool:
        """Whether the engine holds the published version (or a newer one). Prompts are released at the published
        version, so an engine behind it (just started, or back from a failed weight sync) would sample a prompt
        with weights older than its release: it waits for the learner's weights first."""
        if not getattr(self.engine, "has_weight_sync", False):
            return True
        return int(self.engine.version) >= await asyncio.to_thread(self.buffer.version)

    def _engine_version(self) -> float:
        """The version of the engine's weights; unbounded for an engine that never takes the learner's weights."""
        return int(self.engine.version) if getattr(self.engine, "has_weight_sync", False) else float("inf")

    async def claim_loop(self) -> None:
        while not self.stop.is_set():
            try:
                await self._claim_until_stopped()
            except REDIS_UNAVAILABLE as exc:  # past buffer.reconnect_s: keep trying, the groups held go on
                log.warning("worker %s: cannot claim prompts (%s); trying again", self.worker_id, exc)
                await asyncio.sleep(1.0)

    async def _give_back_orphan_leases(self) -> None:
        """After a reconnect: a claim whose reply was lost leased prompts to this worker that it never saw; they go
        back at once instead of when their lease expires."""
        if self.buffer.reconnects.count == self._reconnects:
            return
        self._reconnects = self.buffer.reconnects.count
        leased = await asyncio.to_thread(self.buffer.leased_by, self.worker_id)
        orphans = [entry_id for entry_id in leased if entry_id not in self.held]
        if orphans:
            log.info(
                "worker %s: giving back %d prompt(s) a lost reply leased to it", self.worker_id, len(orphans)
            )
            await asyncio.to_thread(self.buffer.release_claims, self.worker_id, orphans)

    async def _claim_until_stopped(self) -> None:
        while not self.stop.is_set():
            free = self.cfg.max_inflight_groups - len(self.held)
            if free <= 0:
                self._slot_free.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._slot_free.wait(), timeout=1.0)
                continue
            await self._give_back_orphan_leases()
            if not await self._holds_published_weights():
                self.waiting_for_weights = True
                await asyncio.sleep(self.cfg.weight_sync_poll_s)
                continue
            self.waiting_for_weights = False
            if self.tools.paused:  # the tool keeps failing: sample nothing until a probe succeeds
                await asyncio.sleep(min(1.0, self.cfg.tool_pause.probe_s))
                continue
            claimed = await asyncio.to_thread(
                self.buffer.claim_prompts,
                self.worker_id,
                min(free, self.cfg.claim_batch_groups),
                self.cfg.claim_block_ms,
            )
            if self.stop.is_set() and claimed:
                # stopped while the claim was waiting: give them straight back
                await asyncio.to_thread(
                    self.buffer.release_claims, self.worker_id, [c.entry_id for c in claimed]
                )
                break
            # the learner may publish a version while the claim waits (after a failed weight push, without this
            # engine holding it): a prompt released at a version newer than the engine's weights goes back, or its
            # tokens would be older than its release and break the staleness bound the learner enforces
            behind = [c for c in claimed if not may_sample(c.prompt.release_version, self._engine_version())]
            if behind:
                await asyncio.to_thread(
                    self.buffer.release_claims, self.worker_id, [c.entry_id for c in behind]
                )
                claimed = [c for c in claimed if may_sample(c.prompt.release_version, self._engine_version())]
            for item in claimed:
                self.held[item.entry_id] = item
                task = asyncio.create_task(self._run_one(item), name=f"group:{item.prompt.group_id}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            if not claimed and self.cfg.claim_block_ms <= 0:
                await asyncio.sleep(0.2)

    async def _run_one(self, item: ClaimedPrompt) -> None:
        n = self.cfg.group_size
        self.telemetry.count_inflight(n)
        finished = 0

        def trajectory_done(rollout: Rollout) -> None:
            nonlocal finished
            finished += 1
            self.telemetry.tool_calls += rollout.tool_calls
            self.telemetry.count_inflight(-1)
            if self.tools.record(rollout.tool_calls, rollout.tool_errors, rollout.tool_seconds):
                log.warning(
                    "worker %s: sampling paused: %s; resuming once a test call (every %g s) succeeds",
                    self.worker_id,
                    self.tools.pause_reason,
                    self.cfg.tool_pause.probe_s,
                )

        try:
            group, rollouts = await run_group(
                self.engine,
                item.prompt,
                self.task,
                self.tokenizer,
                self.settings,
                n=n,
                chat_template=self.chat_template,
                max_prompt_tokens=self.max_prompt_tokens,
                worker_id=self.worker_id,
                on_rollout_done=trajectory_done,
            )
            group.validate()
            if self.tools.paused and any(r.tool_errors for r in rollouts):
                # sampled while the tool failed: its observations are error text, not search results; the prompt
                # goes back and is sampled again once the tool answers (no failure recorded against it)
                self.telemetry.groups_given_back += 1
                self.held.pop(item.entry_id, None)
                await asyncio.to_thread(self.buffer.release_claims, self.worker_id, [item.entry_id])
                return
            await self._put(group, item.entry_id)
            self.telemetry.group_put(group, rollouts)
            del self.held[item.entry_id]
        except asyncio.CancelledError:
            raise  # the drain gives the lease back
        except Exception as exc:
            self.telemetry.groups_failed += 1
            log.exception("group %s failed; its prompt goes back to the buffer", item.prompt.group_id)
            self.held.pop(item.entry_id, None)
            # retried at once; dead-lettered with this error after the last try
            with contextlib.suppress(Exception):
                await asyncio.to_thread(
                    self.buffer.fail_prompt, self.worker_id, item.entry_id, f"{type(exc).__name__}: {exc}"
                )
        finally:
            self.telemetry.count_inflight(-(n - finished))  # trajectories that never finished are gone
            self._slot_free.set()

    async def _put(self, group: Any, entry_id: str) -> None:
        """Put a finished group; while Redis is unreachable or full past `buffer.reconnect_s`, try again (a put sent
        twice is stored once: buffer/redis_buffer.py) until the worker stops, rather than throw the group away."""
        while True:
            try:
                await asyncio.to_thread(self.buffer.put_group, group, entry_id)
                return
            except REDIS_UNAVAILABLE as exc:
                if self.stop.is_set():
                    raise
                log.warning(
                    "worker %s: cannot put group %s (%s); trying again", self.worker_id, group.group_id, exc
                )
                await asyncio.sleep(1.0)

    async def drain(self) -> None:
        """Wait up to `drain_timeout_s` for the running groups, cancel the rest and release their prompts."""
        tasks = list(self._tasks)
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=self.cfg.drain_timeout_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        left = list(self.held)
        if left:
            log.info(
                "worker %s: releasing %d unfinished prompt(s) to other workers", self.worker_id, len(left)
            )
            await asyncio.to_thread(self.buffer.release_claims, self.worker_id, left)
            self.held.clear()

    async def lease_loop(self) -> None:
        """Renew the leases of the held prompts (a third of `lease_s`, 0.5–10 s) until cancelled."""
        period = max(0.5, min(self.buffer.lease_s / 3, 10.0))
        while True:
            await asyncio.sleep(period)
            held = list(self.held)
            if held:
                try:
                    await asyncio.to_thread(self.buffer.renew_leases, self.worker_id, held)
                except Exception as exc:  # Redis hiccup: the next renewal or a reclaim covers it
                    log.warning("lease renewal failed: %s", exc)
