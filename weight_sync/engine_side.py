"""Engine side of weight sync: `EngineWeightSync` tracks one engine's membership in the group and its updates.

Used by the process that owns a vLLM `AsyncLLM` built with `WeightSyncExtension` (the generator worker):

    rv = Rendezvous(redis_url, namespace)
    sync = EngineWeightSync(rv, worker_id="gen-0")
    cursor = rv.event_cursor()                      # before looking: an announcement meanwhile still wakes the wait
    if await sync.ensure_joined(llm):               # claim a rank per vLLM worker, collective_rpc("ws_join")
        if update := sync.pending_update(current_version):  # a newer announced update, or None
            ...                                     # pause -> collective_rpc("ws_receive", args=(update,)) -> resume
            sync.acknowledge(update)                # loaded: remembered, and acked to the learner
    cursor = rv.wait_for_event(cursor, poll_s)      # wakes on the learner's next announcement

`ensure_joined` returns False until a learner published a rendezvous, and after a failed sync until the learner
opened a new epoch (an engine never claims twice in one epoch). After a failed receive, set `sync.epoch = None`:
the worker left the broken group and the next epoch is joined.
"""

from __future__ import annotations

import logging

from weight_sync.rendezvous import Rendezvous

log = logging.getLogger(__name__)


class EngineWeightSync:
    """One engine's membership in the weight-sync group, driven from the engine's asyncio loop."""

    def __init__(self, rendezvous: Rendezvous, worker_id: str):
        self.rendezvous = rendezvous
        self.worker_id = worker_id
        self.epoch: int | None = None
        self._joined: set[int] = set()  # epochs joined once: never claim a second rank in the same epoch
        self._applied: tuple[int, int] | None = None  # (epoch, version) of the last update loaded

    async def ensure_joined(self, engine) -> bool:
        """Join (or re-join, when the learner opened a new epoch) the group; False when no learner is there yet."""
        info = self.rendezvous.read()
        if info is None:
            return False
        if info["epoch"] == self.epoch:
            return True
        if info["epoch"] in self._joined:
            # This engine left that epoch (a sync failed); wait for the learner to open a new one.
            return False
        # One rank per vLLM worker: every worker of a tensor-parallel engine receives the full weights and loads its
        # own shards (the engine's workers answer with their index in the engine, 0..n-1).
        indices = await engine.collective_rpc("ws_worker_index")
        workers = len(indices)
        if sorted(indices) != list(range(workers)):
            raise RuntimeError(
                f"weight sync: engine {self.worker_id}'s workers report indices {indices}, expected 0..{workers - 1}"
            )
        first = self.rendezvous.claim_rank(info["epoch"], self.worker_id, workers=workers)
        log.info(
            "weight sync: %s joins epoch %d as rank %d (%d worker(s))",
            self.worker_id,
            info["epoch"],
            first,
            workers,
        )
        self._joined.add(info["epoch"])
        # Returns at once: each worker connects in the background as rank first + its index, and ws_receive waits
        # for the connection.
        await engine.collective_rpc("ws_join", args=(info, first))
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
        update = self.rendezvous.latest_update()
        if update is None or update["epoch"] != self.epoch or int(update["version"]) < current_version:
            return None
        if (update["epoch"], int(update["version"])) == self._applied:
            return None
        return update

    def acknowledge(self, update: dict) -> None:
        """`update` is loaded (`ws_receive` returned on every worker): remember it, so that `pending_update` does not
        offer it again, and ack it to the learner, whose publish waits for every engine's ack. Blocks on Redis: from
        an event loop, run it in a thread."""
        self._applied = (update["epoch"], int(update["version"]))
        self.rendezvous.ack_update(int(update["version"]), self.worker_id)
