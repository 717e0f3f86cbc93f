"""Async helpers for the process that owns a vLLM `AsyncLLM` built with `WeightSyncExtension`.

    sync = EngineWeightSync(redis_client, namespace, worker_id="gen-0")
    await sync.ensure_joined(engine)               # claim a rank, collective_rpc("ws_join") (re-joins on a new epoch)
    update = sync.pending_update(current_version)  # a newer announced update, or None
    if update: await sync.apply(engine, update)     # pause -> ws_receive -> resume (finally) -> ack

The generators' `Engine` wrapper may call these or do the same steps itself (see the weight-sync contract).
`ensure_joined` returns False until a learner published a rendezvous, and after a failed sync until the learner
opened a new epoch (an engine never claims two ranks in one epoch).
"""

from __future__ import annotations

import asyncio
import logging

import redis

from weight_sync import rendezvous

log = logging.getLogger(__name__)


class EngineWeightSync:
    """One engine's membership in the weight-sync group, driven from the engine's asyncio loop."""

    def __init__(self, r: redis.Redis, namespace: str, worker_id: str):
        self.redis = r
        self.namespace = namespace
        self.worker_id = worker_id
        self.epoch: int | None = None
        self._joined: set[int] = set()  # epochs joined once: never claim a second rank in the same epoch
        self._applied: tuple[int, int] | None = None  # (epoch, version) of the last update loaded

    async def ensure_joined(self, engine) -> bool:
        """Join (or re-join, when the learner opened a new epoch) the group; False when no learner is there yet."""
        info = rendezvous.read_rendezvous(self.redis, self.namespace)
        if info is None:
            return False
        if info["epoch"] == self.epoch:
            return True
        if info["epoch"] in self._joined:
            # This engine left that epoch (a sync failed); wait for the learner to open a new one.
            return False
        rank = rendezvous.claim_rank(self.redis, self.namespace, info["epoch"], self.worker_id)
        log.info("weight sync: %s joins epoch %d as rank %d", self.worker_id, info["epoch"], rank)
        self._joined.add(info["epoch"])
        # Returns at once: the worker connects in the background and ws_receive waits for the connection.
        await engine.collective_rpc("ws_join", args=(info, rank))
        self.epoch = info["epoch"]
        return True

    def pending_update(self, current_version: int) -> dict | None:
        """The announced update if this engine has not loaded it yet and it is meant for this engine's epoch.

        Not loaded yet means: not older than `current_version`, and not the (epoch, version) applied last. The
        same version can come twice: a learner publishes its starting weights (version 0 on a fresh run, the
        checkpoint's version on a resume) to engines that may already claim that version number, and every
        engine in the group must take part in that broadcast.
        An update of another epoch is left alone: it is a failed publish to an old group (the learner will
        publish again in the new one) or one for a group this engine has not joined yet.
        """
        update = rendezvous.latest_update(self.redis, self.namespace)
        if update is None or update["epoch"] != self.epoch or int(update["version"]) < current_version:
            return None
        if (update["epoch"], int(update["version"])) == self._applied:
            return None
        return update

    async def apply(self, engine, update: dict, pause_mode: str = "keep") -> int:
        """Pause generation, receive and load `update`, resume (always), ack. Returns tensors loaded per worker.

        pause_mode "keep" freezes in-flight requests, which continue under the new weights after the resume.
        """
        if update["epoch"] != self.epoch and not await self.ensure_joined(engine):
            raise RuntimeError(
                f"update version {update['version']} is for weight-sync epoch {update['epoch']}, which this "
                f"engine ({self.worker_id}) cannot join"
            )
        # the KV computed with the old weights must go
        await engine.pause_generation(mode=pause_mode, clear_cache=True)
        try:
            loaded = await engine.collective_rpc("ws_receive", args=(update,))
        except Exception:
            self.epoch = None  # the worker left the broken group; join the next epoch
            raise
        finally:
            await engine.resume_generation()
        self.mark_applied(update)
        rendezvous.ack_update(self.redis, self.namespace, int(update["version"]), self.worker_id)
        return int(loaded[0])

    def mark_applied(self, update: dict) -> None:
        """Record that `update` is loaded (callers that receive through their own engine wrapper call this)."""
        self._applied = (update["epoch"], int(update["version"]))

    async def leave(self, engine) -> None:
        await engine.collective_rpc("ws_leave")
        self.epoch = None


async def run_sync_loop(
    engine, sync: EngineWeightSync, get_version, set_version, poll_s: float = 0.2
) -> None:
    """Forever: join when a learner appears, apply every newer update (a small reference loop for tests/tools)."""
    while True:
        try:
            cursor = rendezvous.event_cursor(sync.redis, sync.namespace)
            if await sync.ensure_joined(engine):
                update = sync.pending_update(get_version())
                if update is not None:
                    await sync.apply(engine, update)
                    set_version(int(update["version"]))
            # woken by the learner's next announcement, or after poll_s at the latest
            await asyncio.to_thread(rendezvous.wait_for_event, sync.redis, sync.namespace, cursor, poll_s)
        except Exception as exc:  # a failed sync must not kill the generator; the learner re-opens the group
            log.warning("weight sync: %s", exc)
            await asyncio.sleep(poll_s)
