"""Following the learner's weights: a generator worker joins the weight-sync group when a rendezvous appears and
applies every newer update, generating with the weights it has meanwhile.

    weights = WeightFollower(cfg, buffer, engine, worker_id="gen-0")
    await weights.follow()              # until cancelled; returns at once for an engine without weight sync
    async with weights.pinned_weights():   # an evaluation: no update lands inside, the engine leaves the group
        ...

It announces itself every 2 s while it wants weights (the learner groups announced engines in), waits on the
rendezvous' announcement stream between checks, and acks each update it loads. A broken group never stops
generation: the engine leaves it and joins the learner's next one. `state` is what the heartbeat reports
(`rollout/weight_sync_state`: none, waiting, joined:<epoch>, error). The protocol is weight_sync/README.md's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from buffer.connection import REDIS_ERROR
from buffer.connection import RETRIED as REDIS_UNAVAILABLE
from buffer.redis_buffer import ReplayBuffer
from generators.settings import GeneratorsConfig
from weight_sync.engine_side import EngineWeightSync
from weight_sync.rendezvous import Rendezvous

log = logging.getLogger(__name__)


class WeightFollower:
    """Keeps one engine on the learner's latest weights, unless `pinned`."""

    def __init__(self, cfg: GeneratorsConfig, buffer: ReplayBuffer, engine: Any, *, worker_id: str):
        self.cfg = cfg
        self.buffer = buffer
        self.engine = engine
        self.worker_id = worker_id
        self.state = "none"
        self.pinned = False  # an evaluation holds the weights: no update, not in the weight-sync group
        self._weights_lock = asyncio.Lock()
        self._rendezvous: Rendezvous | None = None

    async def follow(self) -> None:
        """Join the learner's weight-sync group when it appears; apply every newer update."""
        if not getattr(self.engine, "has_weight_sync", False):
            return
        rendezvous = self._rendezvous = Rendezvous(
            self.buffer.url, self.buffer.namespace, self.buffer.reconnect_s, self.buffer.socket_timeout_s
        )
        sync = EngineWeightSync(rendezvous, self.worker_id)
        self.state = "waiting"
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
                except REDIS_ERROR as exc:
                    log.warning("weight sync: waiting for the learner's announcements: %s", exc)
                    await asyncio.sleep(self.cfg.weight_sync_poll_s)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(rendezvous.withdraw_engine, self.worker_id)
            rendezvous.close()

    async def _sync_once(self, sync: EngineWeightSync) -> str | None:
        """Join if needed and load a pending update; returns the event cursor to wait from (None after an error)."""
        rendezvous = sync.rendezvous
        try:
            cursor = await asyncio.to_thread(rendezvous.event_cursor)
            if not await sync.ensure_joined(self.engine.llm):
                return cursor
            self.state = f"joined:{sync.epoch}"
            update = await asyncio.to_thread(sync.pending_update, self.engine.version)
            if update is None:
                return cursor
            if update.get("epoch") != sync.epoch:
                sync.epoch = None
                await sync.ensure_joined(self.engine.llm)
            started = time.monotonic()
            loaded = await self.engine.apply_update(update)
            await asyncio.to_thread(sync.acknowledge, update)
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
            self.state = "error"
            return None

    @contextlib.asynccontextmanager
    async def pinned_weights(self):
        """No weight update while inside: wait for one in progress, leave the group, come back after."""
        async with self._weights_lock:
            self.pinned = True
            if self._rendezvous is not None:
                await asyncio.to_thread(self._rendezvous.withdraw_engine, self.worker_id)
            try:
                yield
            finally:
                self.pinned = False
