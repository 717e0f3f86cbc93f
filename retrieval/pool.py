"""Several server processes on one port: `retrieval.server.workers` > 1.

One server process tops out at about one core: HTTP parsing, JSON and query tokenising run under the GIL. With
`workers: N` the `serve` process is worker 0 and starts N-1 more (spawned, not forked); each loads the same index
(BM25's score matrix, the corpus and its offsets are memory-mapped, so the OS shares their pages), binds the same
port with SO_REUSEPORT, and batches its own requests with its own cache; the kernel spreads connections over them.

- `/metrics` on any worker answers for the pool: each worker writes its counters into a shared array every half
  second (`SharedCounters`); counts are summed, latency percentiles and the largest batch are the worst worker's.
- Worker 0 announces `listening on ...` once every worker is listening, and restarts a worker that dies (with a
  growing delay if it keeps dying); the others exit when worker 0 is gone. SIGTERM to worker 0 stops them all.
  A dying worker's open connections are reset (the sr1 client retries them); new ones go to the live workers.
- Before anything binds, the port is checked without SO_REUSEPORT, so a stale server still holding it is an error
  rather than a silent partner in the pool.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import signal
import socket
import time
from multiprocessing.synchronize import Event

from retrieval.server import COUNTER_KEYS
from retrieval.settings import RetrievalConfig

log = logging.getLogger(__name__)

MAX_AUTO_WORKERS = 8
RESTART_DELAY_S = 0.5  # a worker dying within a minute of its start waits this, doubled each time, up to MAX_RESTART_DELAY_S
MAX_RESTART_DELAY_S = 30.0


def resolve_workers(cfg: RetrievalConfig) -> int:
    """`retrieval.server.workers`, or for 0: one per core (at most 8) when the retriever's index is shared between
    processes (bm25 over a prebuilt index), else 1 (a dense encoder or GPU index would be loaded once per worker; a
    bm25 index built at start would be built once per worker)."""
    if cfg.server.workers:
        return cfg.server.workers
    if cfg.retriever.shares_index():
        return max(1, min(os.cpu_count() or 1, MAX_AUTO_WORKERS))
    return 1


class SharedCounters:
    """Each worker's `/metrics` counters in one shared array of doubles, a row per worker."""

    def __init__(self, workers: int, ctx: mp.context.BaseContext):
        self.workers = workers
        self._values = ctx.RawArray("d", workers * len(COUNTER_KEYS))

    def read(self, slot: int) -> dict[str, float]:
        base = slot * len(COUNTER_KEYS)
        return dict(zip(COUNTER_KEYS, self._values[base : base + len(COUNTER_KEYS)], strict=True))

    def write(self, slot: int, counters: dict[str, float]) -> None:
        base = slot * len(COUNTER_KEYS)
        self._values[base : base + len(COUNTER_KEYS)] = [float(counters[k]) for k in COUNTER_KEYS]

    def exchange(self, slot: int, own: dict[str, float]) -> list[dict[str, float]]:
        """Write this worker's counters; return every worker's (this one's fresh, the others' as last written)."""
        self.write(slot, own)
        return [own if i == slot else self.read(i) for i in range(self.workers)]


def claim_port(host: str, port: int) -> int:
    """`port` (a free one for 0) after checking that nothing listens on it. The check binds without SO_REUSEPORT:
    a stale server holding the port with SO_REUSEPORT would otherwise silently share it with the new pool."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(addr)
        except OSError as exc:
            raise OSError(f"cannot serve on {host}:{port}: {exc.strerror}") from None
        return probe.getsockname()[1]


class WorkerPool:
    """Worker 0's companion (see `retrieval.server.Companion`): starts, awaits and restarts workers 1..N-1."""

    def __init__(self, cfg: RetrievalConfig, workers: int):
        self.cfg = cfg
        self.ctx = mp.get_context("spawn")
        self.peers = SharedCounters(workers, self.ctx)
        self.procs: dict[int, mp.process.BaseProcess] = {}
        self.ready_events: dict[int, Event] = {}
        self.started_at: dict[int, float] = {}
        self.delay: dict[int, float] = {}
        self.restarts = 0

    def start(self, slot: int) -> None:
        ready = self.ctx.Event()
        proc = self.ctx.Process(
            target=_worker_main,
            args=(self.cfg, slot, self.peers, ready, logging.getLogger().level),
            name=f"retrieval-worker-{slot}",
            daemon=True,
        )
        proc.start()
        self.procs[slot], self.ready_events[slot], self.started_at[slot] = proc, ready, time.monotonic()

    async def ready(self) -> None:
        waiting = set(self.procs)
        while waiting:
            for slot in list(waiting):
                if self.ready_events[slot].is_set():
                    waiting.discard(slot)
                elif not self.procs[slot].is_alive():
                    raise RuntimeError(
                        f"retrieval worker {slot} exited with code {self.procs[slot].exitcode} before it was "
                        "listening (its error is above)"
                    )
            await asyncio.sleep(0.05)

    async def run(self, stop: asyncio.Event) -> None:
        while True:
            await asyncio.sleep(0.25)
            for slot, proc in list(self.procs.items()):
                if proc.is_alive():
                    continue
                died_young = time.monotonic() - self.started_at[slot] < 60
                prev = self.delay.get(slot, 0.0)
                delay = min(MAX_RESTART_DELAY_S, max(RESTART_DELAY_S, 2 * prev)) if died_young else 0.0
                self.delay[slot] = delay
                log.error(
                    "retrieval worker %d exited with code %s; restarting it in %.1fs",
                    slot,
                    proc.exitcode,
                    delay,
                )
                await asyncio.sleep(delay)
                self.restarts += 1
                self.start(slot)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.is_alive():
                proc.terminate()
        for proc in self.procs.values():
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()


class _ParentWatch:
    """A worker's companion: tells worker 0 it is listening, and stops the worker when worker 0 is gone."""

    def __init__(self, ready: Event):
        self._ready = ready

    async def ready(self) -> None:
        self._ready.set()

    async def run(self, stop: asyncio.Event) -> None:
        parent = mp.parent_process()
        while parent is not None and parent.is_alive():
            await asyncio.sleep(0.5)
        stop.set()


def _worker_main(
    cfg: RetrievalConfig, slot: int, peers: SharedCounters, ready: Event, log_level: int
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group; worker 0 stops us
    logging.basicConfig(
        level=log_level, format=f"%(asctime)s %(levelname)s worker{slot} %(name)s: %(message)s"
    )
    from retrieval.server import run_server

    run_server(cfg, ready_line=False, peers=peers, slot=slot, companion=_ParentWatch(ready))


def serve_pool(cfg: RetrievalConfig, workers: int, show_progress: bool = False) -> None:
    """Serve `cfg` with `workers` processes until SIGTERM / Ctrl-C (this process is worker 0)."""
    from retrieval.server import run_server

    server = cfg.server.model_copy(
        update={"workers": workers, "port": claim_port(cfg.server.host, cfg.server.port)}
    )
    # the cores are shared between the workers (bm25's scoring threads)
    cfg = cfg.model_copy(update={"server": server, "retriever": cfg.retriever.for_workers(workers)})
    pool = WorkerPool(cfg, workers)
    try:
        for slot in range(1, workers):  # they load their index while this process loads its own
            pool.start(slot)
        run_server(cfg, show_progress, peers=pool.peers, slot=0, companion=pool)
    finally:
        pool.stop()
