"""Launch the generator pool: N worker processes (one vLLM engine each), locally or as Ray actors.

Locally each worker is `python -m generators.worker` with its own slice of GPUs (`CUDA_VISIBLE_DEVICES`,
`engine.tensor_parallel_size` GPUs per engine; none on CPU). With Ray, a placement group reserves one bundle of
`tensor_parallel_size` GPUs per engine and each actor supervises the same worker process on its node, so both
modes run identical code. SIGTERM/SIGINT to the pool reaches every worker, which drains and exits.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def worker_command(
    config: str, redis_url: str, worker_id: str, engine_index: int, overrides: list[str]
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "generators.worker",
        "--config",
        config,
        "--redis-url",
        redis_url,
        "--worker-id",
        worker_id,
        "--engine-index",
        str(engine_index),
        *overrides,
    ]


def _die_with_parent() -> None:
    """In the child before exec (Linux): get SIGTERM when the pool process dies, so no engine is orphaned."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _gpu_slices(num_engines: int, per_engine: int) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES for each engine, or None on machines without GPUs."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        devices = [d for d in visible.split(",") if d.strip()]
    else:
        try:
            import torch

            devices = [str(i) for i in range(torch.cuda.device_count())]
        except Exception:  # no torch CUDA runtime: CPU engines
            devices = []
    if not devices:
        return [None] * num_engines
    need = num_engines * per_engine
    if need > len(devices):
        raise SystemExit(
            f"{num_engines} engines x tensor_parallel_size {per_engine} need {need} GPUs; {len(devices)} visible"
        )
    return [",".join(devices[i * per_engine : (i + 1) * per_engine]) for i in range(num_engines)]


def run_local(
    config: str,
    overrides: list[str],
    redis_url: str,
    num_engines: int,
    tensor_parallel_size: int,
    drain_timeout_s: float,
    worker_prefix: str,
) -> int:
    """Start the workers as child processes and supervise them until they exit or the pool is told to stop."""
    procs: list[subprocess.Popen] = []
    for i, gpus in enumerate(_gpu_slices(num_engines, tensor_parallel_size)):
        env = dict(os.environ)
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        cmd = worker_command(config, redis_url, f"{worker_prefix}{i}", i, overrides)
        log.info("starting generator %d%s: %s", i, f" on GPUs {gpus}" if gpus else "", " ".join(cmd))
        procs.append(subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent))

    stopping = False
    reported: set[int] = set()

    def stop(signum, _frame) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while any(p.poll() is None for p in procs):
            time.sleep(0.5)
            for i, p in enumerate(procs):
                if p.returncode not in (None, 0) and not stopping and i not in reported:
                    reported.add(i)
                    log.error("generator %d exited with status %d; the others keep running", i, p.returncode)
            if stopping:
                deadline = time.monotonic() + drain_timeout_s + 30
                while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                    time.sleep(0.5)
                for p in procs:
                    if p.poll() is None:
                        log.warning("generator pid %d did not drain in time; killing it", p.pid)
                        p.kill()
                break
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return max((p.wait() for p in procs), default=0)


def run_ray(
    cfg_dump: dict[str, Any],
    redis_url: str,
    num_engines: int,
    tensor_parallel_size: int,
    worker_prefix: str,
    address: str | None = None,
) -> int:
    """One Ray actor per engine inside a placement group (one bundle of GPUs per engine)."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.init(address=address or os.environ.get("RAY_ADDRESS"), ignore_reinit_error=True)
    gpus = float(ray.cluster_resources().get("GPU", 0))
    per_gpu = tensor_parallel_size if gpus else 0
    bundles = [{"CPU": 1, "GPU": per_gpu} if per_gpu else {"CPU": 1} for _ in range(num_engines)]
    pg = placement_group(bundles, strategy="PACK")
    ray.get(pg.ready(), timeout=600)

    @ray.remote(num_cpus=1)
    class GeneratorActor:
        """Supervises one `python -m generators.worker` on its node (GPUs given by Ray)."""

        def __init__(self, cfg_dump: dict[str, Any], redis_url: str, worker_id: str, index: int):
            import yaml

            path = Path(tempfile.mkdtemp(prefix="sr1-gen-")) / "config.yaml"
            path.write_text(yaml.safe_dump(cfg_dump))
            self.proc = subprocess.Popen(
                worker_command(str(path), redis_url, worker_id, index, []), preexec_fn=_die_with_parent
            )

        def wait(self) -> int:
            return self.proc.wait()

        def stop(self) -> None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)

    actors = []
    for i in range(num_engines):
        strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i)
        options = {"scheduling_strategy": strategy, "num_gpus": per_gpu}
        actors.append(GeneratorActor.options(**options).remote(cfg_dump, redis_url, f"{worker_prefix}{i}", i))

    def stop(signum, _frame) -> None:
        for actor in actors:
            actor.stop.remote()

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, stop)
    codes = ray.get([a.wait.remote() for a in actors])
    return max(codes, default=0)


def default_worker_prefix() -> str:
    return f"{socket.gethostname()}-gen"
