"""The shared resources of a simulated pipeline, each a processor-sharing server: an engine batching sequences, and
the retrieval server answering searches.

    engine = Engine(0, profile.generator, max_num_seqs=512)       # k sequences share tokens_per_s(k)
    server = RetrievalServer(profile.retrieval.requests_per_s)    # k requests share requests_per_s(k)

A server with k jobs in service completes work at `capacity(k)` units per second in all, each job progressing at
`capacity(k) / k` (continuous batching, micro-batching: every job in flight advances at the same rate); at most
`slots` jobs are in service, the rest wait in order. `v` is the work each job in service has received since the
server started, so a job finishes when `v` reaches its start plus its work; `simulate.py` asks `next_completion()`
and schedules the event.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable
from typing import Any


class SharingServer:
    """Processor sharing of `capacity(k)` units/s among the k jobs in service, at most `slots` of them."""

    def __init__(self, capacity: Callable[[int], float], slots: int):
        self.capacity, self.slots = capacity, slots
        self.running: dict[int, Any] = {}
        self.finish_heap: list[tuple[float, int]] = []
        self.queue: deque[tuple[Any, float]] = deque()
        self.v = 0.0
        self.t = 0.0
        self.paused = False
        self.speed = 1.0  # a share of the device (an engine sharing its GPU with a training learner rank)
        self.epoch = 0  # bumps whenever the next completion time may change
        self.ids = itertools.count()

    def rate(self) -> float:
        """The work per second each job in service receives now."""
        n = len(self.running)
        if n == 0 or self.paused:
            return 0.0
        return self.speed * self.capacity(n) / n

    def advance(self, now: float) -> None:
        self.v += (now - self.t) * self.rate()
        self.t = now

    def next_completion(self) -> float | None:
        rate = self.rate()
        if rate <= 0 or not self.finish_heap:
            return None
        return self.t + max(self.finish_heap[0][0] - self.v, 0.0) / rate

    def submit(self, job: Any, work: float) -> None:
        if len(self.running) < self.slots:
            self._start(job, work)
        else:
            self.queue.append((job, work))

    def _start(self, job: Any, work: float) -> None:
        key = next(self.ids)
        self.running[key] = job
        heapq.heappush(self.finish_heap, (self._finish_at(job, work), key))

    def _finish_at(self, job: Any, work: float) -> float:
        return self.v + work

    def pop_finished(self) -> Any:
        _, key = heapq.heappop(self.finish_heap)
        job = self.running.pop(key)
        if self.queue:
            self._start(*self.queue.popleft())
        return job


class Engine(SharingServer):
    """One generator engine and its worker: sequences share the engine's tokens/s curve, capped by what one worker
    process can drive (`generator.worker_tokens_per_s`, when the profile has it)."""

    def __init__(self, index: int, generator, max_num_seqs: int):
        curve = generator.tokens_per_s
        self.worker_ceiling = (
            generator.worker_tokens_per_s.value if generator.worker_tokens_per_s is not None else None
        )
        capacity = curve.at if self.worker_ceiling is None else self._capped(curve.at, self.worker_ceiling)
        super().__init__(capacity, max_num_seqs)
        self.curve = curve.at
        self.index = index
        self.version = 0
        self.groups_held = 0
        self.inflight = 0  # trajectories of this worker in flight (engine or search)
        self.busy_s = 0.0
        self.worker_bound_s = 0.0  # time the engine could have run faster than its worker drives it

    @staticmethod
    def _capped(curve: Callable[[int], float], ceiling: float) -> Callable[[int], float]:
        return lambda n: min(curve(n), ceiling)

    def advance(self, now: float) -> None:
        dt = now - self.t
        if self.inflight > 0:
            self.busy_s += dt
        running = len(self.running)
        if (
            self.worker_ceiling is not None
            and running
            and not self.paused
            and self.curve(running) > self.worker_ceiling
        ):
            self.worker_bound_s += dt
        super().advance(now)

    def _start(self, turn, work: float) -> None:
        turn.start_v = self.v
        super()._start(turn, work)

    def _finish_at(self, turn, work: float) -> float:
        return self.v + turn.prefill_work + turn.decode  # the same sum, in the same order, as `work`

    def credit(self, turn, upto: int) -> None:
        """Credit the turn's sampled tokens up to `upto` to the engine's current version."""
        tokens = upto - turn.attributed
        if tokens > 0:
            by_version = turn.trajectory.group.tokens_by_version
            by_version[self.version] = by_version.get(self.version, 0) + tokens
            turn.attributed = upto

    def change_version(self, version: int) -> None:
        """New weights: the tokens sampled so far by running turns belong to the old version."""
        for turn in self.running.values():
            done = int(min(max(self.v - turn.start_v - turn.prefill_work, 0.0), turn.decode))
            self.credit(turn, done)
        self.version = version


class RetrievalServer(SharingServer):
    """The retrieval server: k searches in flight share `requests_per_s(k)` (the curve `bench_retrieval.py --curve`
    measures with k closed-loop clients); every search is one request of one unit of work."""

    def __init__(self, curve):
        super().__init__(
            curve.at, slots=10**9
        )  # the server accepts every connection; its curve says how it copes
        self.alone_s = 1.0 / curve.at(1)  # a request's time in the server with nothing else in flight
        self.busy_s = 0.0

    def advance(self, now: float) -> None:
        if self.running:
            self.busy_s += now - self.t
        super().advance(now)


class SharedLearner:
    """A learner step on GPUs it shares with engines: `left` seconds of work at full speed, done at `rate` (its
    share while an engine decodes beside it, 1 otherwise); `epoch` bumps whenever its finish time may change."""

    def __init__(self, work: float, now: float, wait: float, started: float):
        self.left, self.t, self.rate, self.epoch = work, now, 0.0, 0
        self.wait, self.started = wait, started

    def set_rate(self, now: float, rate: float) -> bool:
        """Progress until `now` at the old rate, then go on at `rate`; whether the finish time changed."""
        self.left -= (now - self.t) * self.rate
        self.t = now
        if rate == self.rate:
            return False
        self.rate, self.epoch = rate, self.epoch + 1
        return True

    def finish(self) -> float:
        return self.t + max(self.left, 0.0) / self.rate
