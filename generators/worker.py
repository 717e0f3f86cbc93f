"""A generator worker: one engine kept full of agent trajectories of the task, streaming finished groups to Redis.

    worker = GeneratorWorker(job.generators, buffer, engine, tokenizer, task, worker_id="gen-0", max_model_len=512)
    await worker.run()          # until request_stop(); the process around it is generators/process.py

It claims prompts from the buffer (leases, renewed while they run), runs the n samples of each group concurrently
(up to `generators.max_inflight_groups` groups at once, so the engine batches hundreds of trajectories), pushes
each group the moment it is complete, heartbeats with metrics, answers evaluation requests, and follows the
learner's weights: it joins the weight-sync group when a rendezvous appears (in the background, generating with
the initial weights meanwhile) and applies every newer update. On stop it stops claiming, finishes what it holds
within `generators.drain_timeout_s`, releases the rest to other workers and returns 0.

Redis unreachable (a restart, a network cut) or full: every call retries for `buffer.reconnect_s`; past that the
worker keeps claiming and putting again (a put is idempotent), saying so, instead of dying with the groups it holds.
After a reconnect it gives back the prompts a claim whose reply was lost leased to it without its knowing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from typing import Any

import redis

from buffer.connection import RETRIED as REDIS_UNAVAILABLE
from buffer.redis_buffer import ClaimedPrompt, ReplayBuffer
from buffer.staleness import may_sample
from generators.agent import AgentSettings, Rollout
from generators.group import run_group
from generators.settings import GeneratorsConfig
from generators.tool_health import ToolHealth
from tasks import Task

log = logging.getLogger(__name__)

ROLE = "generator"


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
        self.tokenizer = tokenizer
        self.worker_id = worker_id
        self.max_prompt_tokens = max_prompt_tokens
        self.chat_template = chat_template
        self.settings = AgentSettings.from_config(cfg, max_model_len)
        self.max_model_len = max_model_len
        self.eval_prompts = eval_prompts
        self.eval_max_turns = eval_max_turns
        self.eval_seed = eval_seed
        self.task = task
        self._stop = asyncio.Event()
        self._held: dict[str, ClaimedPrompt] = {}
        self._tasks: set[asyncio.Task] = set()
        self._slot_free = asyncio.Event()
        # metrics
        self.started = time.monotonic()
        self.inflight_trajectories = 0
        self._idle_s = 0.0  # time with no trajectory in flight (the engine had no rollout work)
        self._idle_since: float | None = self.started
        self.tool_calls = 0
        self.groups_done = 0
        self.trajectories_done = 0
        self.groups_failed = 0
        # groups that finished with tool errors while paused: given back, sampled again once the tool answers
        self.groups_given_back = 0
        self.eval_errors = 0  # evaluation requests answered with an error record
        self.tools = ToolHealth(cfg.tool_pause)
        self._background_error: BaseException | None = None
        self.finish_reasons: Counter[str] = Counter()
        self._recent: deque[tuple[float, int, float, int]] = deque(
            maxlen=4096
        )  # (time, turns, reward, tool calls)
        self._rate_marks: deque[tuple[float, int, int]] = deque(maxlen=64)  # (time, tokens, tool calls)
        self.weight_sync_state = "none"
        self.waiting_for_weights = False  # the engine is behind the published version: no new claims
        self.pinned = False  # an evaluation holds the weights: no update, not in the weight-sync group
        self._weights_lock = asyncio.Lock()
        self._rendezvous: Any = None
        self._reconnects = buffer.reconnects.count  # connection failures already looked after (orphan leases)

    # -- public ----------------------------------------------------------------------------------------------

    def request_stop(self) -> None:
        if not self._stop.is_set():
            log.info(
                "worker %s: stopping (no new claims, draining %d group(s))", self.worker_id, len(self._held)
            )
        self._stop.set()
        self._slot_free.set()

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
            await self._claim_loop()
            await self._drain()
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

    def _count_inflight(self, delta: int) -> None:
        """Track trajectories in flight and the time the engine spent with none (its idle fraction)."""
        now = time.monotonic()
        if self.inflight_trajectories == 0 and delta > 0 and self._idle_since is not None:
            self._idle_s += now - self._idle_since
            self._idle_since = None
        self.inflight_trajectories += delta
        if self.inflight_trajectories == 0 and self._idle_since is None:
            self._idle_since = now

    def idle_seconds(self, now: float) -> float:
        """Seconds since the worker started with no trajectory in flight."""
        return self._idle_s + (now - self._idle_since if self._idle_since is not None else 0.0)

    def idle_fraction(self, now: float) -> float:
        return self.idle_seconds(now) / max(now - self.started, 1e-9)

    def metrics(self) -> dict[str, Any]:
        now = time.monotonic()
        tokens = int(getattr(self.engine, "tokens_generated", 0))
        self._rate_marks.append((now, tokens, self.tool_calls))
        # rates over the last ~30 s of heartbeats
        while len(self._rate_marks) > 2 and now - self._rate_marks[0][0] > 30:
            self._rate_marks.popleft()
        t0, tok0, s0 = self._rate_marks[0]
        dt = max(now - t0, 1e-9)
        recent = [r for r in self._recent if now - r[0] <= 60]
        out: dict[str, Any] = {
            "rollout/tokens_per_s": (tokens - tok0) / dt if len(self._rate_marks) > 1 else 0.0,
            "rollout/tool_calls_per_s": (self.tool_calls - s0) / dt if len(self._rate_marks) > 1 else 0.0,
            "rollout/inflight_trajectories": self.inflight_trajectories,
            "rollout/inflight_groups": len(self._held),
            "rollout/groups_done": self.groups_done,
            "rollout/groups_failed": self.groups_failed,
            "rollout/trajectories_done": self.trajectories_done,
            "rollout/tokens_total": tokens,
            "rollout/tool_calls_total": self.tool_calls,
            # over the trajectories this worker finished in the last 60 s
            "rollout/turns_mean_60s": sum(r[1] for r in recent) / len(recent) if recent else 0.0,
            "rollout/reward_mean_60s": sum(r[2] for r in recent) / len(recent) if recent else 0.0,
            "rollout/tool_calls_per_traj_60s": sum(r[3] for r in recent) / len(recent) if recent else 0.0,
            "rollout/version": int(getattr(self.engine, "version", 0)),
            "rollout/uptime_s": now - self.started,
            "rollout/idle_fraction": self.idle_fraction(now),
            # cumulative, so that a reader can take the busy share between any two heartbeats (sr1 plan --from-run)
            "rollout/busy_s": now - self.started - self.idle_seconds(now),
            "rollout/weight_sync_state": self.weight_sync_state,
            "rollout/groups_given_back": self.groups_given_back,
            "rollout/eval_errors": self.eval_errors,
            "rollout/state": self._state(),
            **self.tools.metrics(now),
        }
        for reason, count in self.finish_reasons.items():
            out[f"rollout/finish/{reason}"] = count
        return out

    # -- claiming and running groups --------------------------------------------------------------------------

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

    async def _claim_loop(self) -> None:
        while not self._stop.is_set():
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
        orphans = [entry_id for entry_id in leased if entry_id not in self._held]
        if orphans:
            log.info(
                "worker %s: giving back %d prompt(s) a lost reply leased to it", self.worker_id, len(orphans)
            )
            await asyncio.to_thread(self.buffer.release_claims, self.worker_id, orphans)

    async def _claim_until_stopped(self) -> None:
        while not self._stop.is_set():
            free = self.cfg.max_inflight_groups - len(self._held)
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
            if self._stop.is_set() and claimed:
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
                self._held[item.entry_id] = item
                task = asyncio.create_task(self._run_one(item), name=f"group:{item.prompt.group_id}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            if not claimed and self.cfg.claim_block_ms <= 0:
                await asyncio.sleep(0.2)

    async def _run_one(self, item: ClaimedPrompt) -> None:
        n = self.cfg.group_size
        self._count_inflight(n)
        finished = 0

        def trajectory_done(rollout: Rollout) -> None:
            nonlocal finished
            finished += 1
            self.tool_calls += rollout.tool_calls
            self._count_inflight(-1)
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
                self.groups_given_back += 1
                self._held.pop(item.entry_id, None)
                await asyncio.to_thread(self.buffer.release_claims, self.worker_id, [item.entry_id])
                return
            await self._put(group, item.entry_id)
            now = time.monotonic()
            for traj, rollout in zip(group.trajectories, rollouts, strict=True):
                self.finish_reasons[rollout.finish_reason] += 1
                self._recent.append((now, rollout.turns, traj.reward, rollout.tool_calls))
            self.groups_done += 1
            self.trajectories_done += n
            del self._held[item.entry_id]
        except asyncio.CancelledError:
            raise  # the drain gives the lease back
        except Exception as exc:
            self.groups_failed += 1
            log.exception("group %s failed; its prompt goes back to the buffer", item.prompt.group_id)
            self._held.pop(item.entry_id, None)
            # retried at once; dead-lettered with this error after the last try
            with contextlib.suppress(Exception):
                await asyncio.to_thread(
                    self.buffer.fail_prompt, self.worker_id, item.entry_id, f"{type(exc).__name__}: {exc}"
                )
        finally:
            self._count_inflight(-(n - finished))  # trajectories that never finished are gone
            self._slot_free.set()

    async def _put(self, group: Any, entry_id: str) -> None:
        """Put a finished group; while Redis is unreachable or full past `buffer.reconnect_s`, try again (a put sent
        twice is stored once: buffer/redis_buffer.py) until the worker stops, rather than throw the group away."""
        while True:
            try:
                await asyncio.to_thread(self.buffer.put_group, group, entry_id)
                return
            except REDIS_UNAVAILABLE as exc:
                if self._stop.is_set():
                    raise
                log.warning(
                    "worker %s: cannot put group %s (%s); trying again", self.worker_id, group.group_id, exc
                )
                await asyncio.sleep(1.0)

    async def _drain(self) -> None:
        tasks = list(self._tasks)
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=self.cfg.drain_timeout_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        left = list(self._held)
        if left:
            log.info(
                "worker %s: releasing %d unfinished prompt(s) to other workers", self.worker_id, len(left)
            )
            await asyncio.to_thread(self.buffer.release_claims, self.worker_id, left)
            self._held.clear()

    # -- background loops ----------------------------------------------------------------------------------------

    async def _lease_loop(self) -> None:
        period = max(0.5, min(self.buffer.lease_s / 3, 10.0))
        while True:
            await asyncio.sleep(period)
            held = list(self._held)
            if held:
                try:
                    await asyncio.to_thread(self.buffer.renew_leases, self.worker_id, held)
                except Exception as exc:  # Redis hiccup: the next renewal or a reclaim covers it
                    log.warning("lease renewal failed: %s", exc)

    async def _heartbeat_loop(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.buffer.heartbeat, self.worker_id, ROLE, self.metrics())
            except Exception as exc:
                log.warning("heartbeat failed: %s", exc)
            await asyncio.sleep(self.cfg.heartbeat_s)

    async def _weight_sync_loop(self) -> None:
        """Join the learner's weight-sync group when it appears; apply every newer update."""
        if not getattr(self.engine, "has_weight_sync", False):
            return
        from weight_sync.engine_side import EngineWeightSync
        from weight_sync.rendezvous import Rendezvous

        rendezvous = self._rendezvous = Rendezvous(
            self.buffer.url, self.buffer.namespace, self.buffer.reconnect_s, self.buffer.socket_timeout_s
        )
        sync = EngineWeightSync(rendezvous, self.worker_id)
        self.weight_sync_state = "waiting"
        announced = 0.0
        try:
            while True:
                if self.pinned:  # an evaluation holds the weights; the learner regroups without us
                    await asyncio.sleep(self.cfg.weight_sync_poll_s)
                    announced = 0.0
                    continue
                if time.monotonic() - announced > 2.0:  # alive and wanting weights: the learner groups us in
                    try:
                        await asyncio.to_thread(rendezvous.announce_engine, self.worker_id)
                        announced = time.monotonic()
                    except REDIS_UNAVAILABLE as exc:  # a Redis outage must not end the weight-sync loop
                        log.warning("weight sync: announcing this engine: %s", exc)
                        await asyncio.sleep(self.cfg.weight_sync_poll_s)
                        continue
                # taken before looking, so an announcement made while we look still wakes the wait below
                async with self._weights_lock:
                    cursor = await self._sync_once(sync)
                if cursor is None:
                    await asyncio.sleep(self.cfg.weight_sync_poll_s)
                    continue
                # wakes when the learner announces a rendezvous or an update (at most weight_sync_poll_s later)
                try:
                    await asyncio.to_thread(rendezvous.wait_for_event, cursor, self.cfg.weight_sync_poll_s)
                except redis.RedisError as exc:
                    log.warning("weight sync: waiting for the learner's announcements: %s", exc)
                    await asyncio.sleep(self.cfg.weight_sync_poll_s)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(rendezvous.withdraw_engine, self.worker_id)
            rendezvous.close()

    async def _sync_once(self, sync: Any) -> str | None:
        """Join if needed and load a pending update; returns the event cursor to wait from (None after an error)."""
        rendezvous = sync.rendezvous
        try:
            cursor = await asyncio.to_thread(rendezvous.event_cursor)
            if not await sync.ensure_joined(self.engine.llm):
                return cursor
            self.weight_sync_state = f"joined:{sync.epoch}"
            update = await asyncio.to_thread(sync.pending_update, self.engine.version)
            if update is None:
                return cursor
            if update.get("epoch") != sync.epoch:
                sync.epoch = None
                await sync.ensure_joined(self.engine.llm)
            started = time.monotonic()
            loaded = await self.engine.apply_update(update)
            sync.mark_applied(update)
            await asyncio.to_thread(rendezvous.ack_update, int(update["version"]), self.worker_id)
            log.info(
                "worker %s: weights v%d (%d tensors) in %.2fs",
                self.worker_id,
                self.engine.version,
                loaded,
                time.monotonic() - started,
            )
            return cursor
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a broken group must not stop generation; the learner re-opens it
            log.warning("weight sync: %s", exc)
            sync.epoch = None
            self.weight_sync_state = "error"
            return None

    async def _tool_probe_loop(self) -> None:
        """While sampling is paused for tool errors, make a test call every `probe_s`; resume when one succeeds."""
        cfg = self.cfg.tool_pause
        while True:
            await asyncio.sleep(cfg.probe_s)
            if not self.tools.paused:
                continue
            try:
                failed = (await self.task.call_tool(cfg.probe_input)).failed
            except Exception as exc:  # a task's own error is a failed probe, not a dead loop
                failed = True
                log.debug("tool probe raised %s", exc)
            if not failed:
                log.info(
                    "worker %s: the tool answers again; sampling resumes (was paused: %s)",
                    self.worker_id,
                    self.tools.pause_reason,
                )
                self.tools.resume()

    async def _eval_loop(self) -> None:
        """Answer evaluation requests (buffer/evaluations.py) on the test prompts. A request that cannot be answered
        (a bad field, unreadable test prompts, an engine error) is answered with an error record and counted; a
        Redis outage is waited out. Only an unexpected failure of the loop itself ends the worker (see `run`)."""
        if self.eval_prompts is None:
            return
        while True:
            await asyncio.sleep(1.0)
            try:
                request = await asyncio.to_thread(self.buffer.pop_evaluation_request, self.worker_id)
            except ValueError as exc:  # malformed (no id to answer to): counted by the buffer and dropped
                self.eval_errors += 1
                log.warning("%s", exc)
                continue
            except redis.RedisError as exc:
                log.warning("evaluation requests: %s; trying again", exc)
                continue
            if request is None:
                continue
            try:
                await self._answer_evaluation(request)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.eval_errors += 1
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
                with contextlib.suppress(redis.RedisError):  # else it is re-queued when this worker restarts
                    await asyncio.to_thread(self.buffer.post_evaluation_answer, request, error)

    async def _answer_evaluation(self, request: dict[str, Any]) -> None:
        """Answer one shard of an evaluation at the requested version or a newer one, with the engine's weights
        pinned throughout: it leaves the weight-sync group for the evaluation (no update lands mid-way) and rejoins
        after. Posts the shard's items; whoever asked merges the shards (`evaluation.merge_answers`)."""
        from evaluation import compact_item, select_prompts, shard
        from generators.evaluation import answer_shard

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
            self.eval_prompts(),
            max_prompts=request.get("max_prompts"),
            max_per_source=request.get("max_per_source"),
            seed=self.eval_seed,
        )
        async with self._pinned_weights():
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
                max_turns=self.eval_max_turns,
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

    @contextlib.asynccontextmanager
    async def _pinned_weights(self):
        """No weight update while inside: wait for one in progress, leave the group, come back after."""
        async with self._weights_lock:
            self.pinned = True
            if self._rendezvous is not None:
                await asyncio.to_thread(self._rendezvous.withdraw_engine, self.worker_id)
            try:
                yield
            finally:
                self.pinned = False
