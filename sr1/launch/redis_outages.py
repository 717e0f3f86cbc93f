"""How a launcher's own Redis calls ride out a Redis that its supervisor restarts, and what it clears in a resumed
run's Redis before any pool starts.

    buffer = ride_out_redis(lambda: open_buffer(own), reconnect_s=60, supervise=supervisor_check)

The launcher (`sr1 run`, `sr1 launch`) is the process that restarts a dead Redis, so it must not sit in a long retry
itself: its own calls fail fast (`OWN_RECONNECT_S`) and are retried here between supervisor checks, for up to
`buffer.reconnect_s` in all, as every other client of the run rides out the gap.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from buffer.connection import RETRIED as REDIS_UNAVAILABLE
from buffer.redis_buffer import ReplayBuffer
from weight_sync.rendezvous import Rendezvous

# how long one of the launcher's own Redis calls retries before the loop below takes over
OWN_RECONNECT_S = 1.0
T = TypeVar("T")


def ride_out_redis(call: Callable[[], T], reconnect_s: float, supervise: Callable[[], None]) -> T:
    """`call()`, retried while Redis is down, unreachable or full for up to `reconnect_s`, calling `supervise()`
    meanwhile (that is what restarts a dead Redis)."""
    deadline = None
    while True:
        try:
            return call()
        except REDIS_UNAVAILABLE:
            now = time.monotonic()
            deadline = deadline or now + reconnect_s
            if now > deadline:
                raise
            supervise()
            time.sleep(0.5)


def withdraw_dead_learners_group(buffer: ReplayBuffer) -> None:
    """Withdraw a weight-sync rendezvous left in the run's Redis (a resumed run's, by the learner that died with the
    run): no learner of this run is alive (the run lock), and the generators start before the new one, so they would
    try to join the dead learner's group and hang there for `weight_sync.timeout_s` before joining the new
    learner's."""
    with Rendezvous(buffer.url, buffer.namespace, OWN_RECONNECT_S) as rendezvous:
        rendezvous.clear()
