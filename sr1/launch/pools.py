"""`sr1 generators` and `sr1 learner`: each pool on its own, as local processes (or Ray actors, sr1/launch/ray.py).

    sr1 generators --config qwen2.5-3b-8xh100 --redis-url redis://head:6379/0 --num-engines 4 [overrides]
    sr1 learner --config qwen2.5-3b-8xh100 --redis-url redis://head:6379/0 [--resume] [learner.num_ranks=4 ...]

Both write each process's job config into `<run_dir>/jobs/` (each role's job.py) and start the processes through the
supervisor (sr1/launch/supervisor.py). Generators: one `python -m sr1.entrypoints.generators` per engine, each on
its own slice of GPUs (`engine.tensor_parallel_size` per engine; none on CPU); SIGTERM/SIGINT to the pool drains every
worker, and a worker that fails is reported while the others keep running. Learner: `learner.num_ranks`
`python -m sr1.entrypoints.learner` processes with a torchrun-style environment (so
`torchrun --nproc-per-node N -m sr1.entrypoints.learner --config ...` is equivalent); SIGTERM/SIGINT reach every rank,
which finish the step, checkpoint and exit; one failed rank stops the others (they would hang in a collective).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import socket
import sys
import time

from common.busy import CHECKPOINTING, busy_with
from common.launcher import LAUNCHER_ENV, launcher_owner
from config import EXIT_BAD_INPUT, Config, ConfigError, load_config, save_config, save_job, secret_env
from sr1 import entrypoints
from sr1.launch.lock import RunLock, RunLocked
from sr1.launch.ray import RaySupervisor, place_learner
from sr1.launch.ray_placement import generator_bundle
from sr1.launch.supervisor import Child, Supervisor, free_port, python_module
from sr1.preflight import BadInput, check_inputs

log = logging.getLogger("sr1.launch")


def gpu_slices(num_engines: int, per_engine: int) -> list[str | None]:
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


def rank_env(rank: int, world_size: int, addr: str, port: int, local_rank: int, local_size: int) -> dict:
    """The torchrun-style environment of one learner rank."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_size),
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
    }


def generator_children(cfg: Config, num_engines: int, prefix: str, logs: bool = False) -> list[Child]:
    """One worker process per engine, each with its job file in `<run_dir>/jobs/` and its GPU slice (with
    `generators.use_ray`, Ray gives each engine its GPUs instead: sr1/launch/ray_placement.py)."""
    run_dir = cfg.resolved_run_dir
    tp = cfg.generators.engine.tensor_parallel_size
    slices = [None] * num_engines if cfg.generators.use_ray else gpu_slices(num_engines, tp)
    children = []
    for i, gpus in enumerate(slices):
        worker_id = f"{prefix}{i}"
        job = cfg.generator_job(worker_id, i)
        job_file = save_job(job, run_dir / "jobs" / f"{worker_id}.yaml")
        env = secret_env(job)  # what the job file masks (the Redis password, the retrieval token)
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        cores = cfg.generators.cpu_cores
        if cores:  # vLLM's CPU backend would otherwise bind its OpenMP threads to cores of its own choosing
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
        log_path = run_dir / "logs" / f"{worker_id}.log" if logs else None
        cmd = python_module(entrypoints.GENERATORS, "--config", str(job_file))
        children.append(Child(worker_id, cmd, log_path, env, cpus=tuple(cores) if cores else None))
    return children


def learner_children(cfg: Config, resume: bool, logs: bool = False) -> list[Child]:
    """The learner's ranks on this machine, with its job file in `<run_dir>/jobs/learner.yaml`."""
    run_dir = cfg.resolved_run_dir
    job = cfg.learner_job()
    job_file = save_job(job, run_dir / "jobs" / "learner.yaml")  # its secrets masked: they go in `env`
    n, port = cfg.learner.num_ranks, free_port()
    children = []
    for rank in range(n):
        cmd = python_module(entrypoints.LEARNER, "--config", str(job_file), *(["--resume"] if resume else []))
        name = "learner" if n == 1 else f"learner-{rank}"
        log_path = run_dir / "logs" / f"{name}.log" if logs else None
        env = rank_env(rank, n, "127.0.0.1", port, rank, n) | secret_env(job)
        # this launcher holds the run lock: the learner takes none itself
        env[LAUNCHER_ENV] = launcher_owner()
        cores = tuple(cfg.learner.cpu_cores or ()) or None
        # a stop waits past the grace while the learner writes a checkpoint (rank 0 says so, common/busy.py)
        busy = functools.partial(busy_with, run_dir / CHECKPOINTING)
        children.append(Child(name, cmd, log_path, env, cpus=cores, busy=busy))
    return children


def _supervise(sup: Supervisor, *, on_failure: str, drain_s: float) -> int:
    """Wait for the children; SIGTERM/SIGINT stop them (they drain or checkpoint). `on_failure`: "report" (the
    others keep running) or "stop_all". Returns the worst exit code."""
    stopping = False

    def stop(signum, _frame) -> None:
        nonlocal stopping
        stopping = True
        for child in sup.children:
            if child.alive:
                child.send(signal.SIGTERM if signum == signal.SIGTERM else signal.SIGINT)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    reported: set[str] = set()
    try:
        while any(c.alive for c in sup.children):
            time.sleep(0.5)
            for child in sup.children:
                if child.returncode not in (None, 0) and not stopping and child.name not in reported:
                    reported.add(child.name)
                    log.error("%s", child.failure())
                    if on_failure == "stop_all":
                        for other in sup.children:
                            other.send(signal.SIGTERM)
            if stopping:
                deadline = time.monotonic() + drain_s
                while any(c.alive for c in sup.children) and time.monotonic() < deadline:
                    time.sleep(0.5)
                for child in sup.children:
                    if child.alive:
                        log.warning("%s (pid %d) did not stop in time; killing it", child.name, child.pid)
                sup.stop(grace_s={"": 1.0})
                break
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return max((abs(c.returncode or 0) for c in sup.children), default=0)


def _common_parser(prog: str, doc: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    parser.add_argument("--config", default="tiny", help="preset name or YAML path (default: tiny)")
    parser.add_argument("--redis-url", default=None, help="the run's Redis (default: buffer.redis_url)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. learner.lr=1e-6")
    return parser


def _load(args: argparse.Namespace, prog: str, splits: tuple[str, ...]) -> Config | None:
    """The pool's config with its inputs checked (the prompt files of `splits`); None after printing one line per
    problem, when the pool cannot run."""
    overrides = list(args.overrides) + ([f"buffer.redis_url={args.redis_url}"] if args.redis_url else [])
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return None
    if not cfg.buffer.redis_url:
        print(
            f"{prog}: the pools meet through Redis; give --redis-url or buffer.redis_url=...", file=sys.stderr
        )
        return None
    try:
        notes = check_inputs(cfg, splits)
    except BadInput as err:
        print("\n".join(f"{prog}: {problem}" for problem in err.problems), file=sys.stderr)
        return None
    for note in notes:
        print(f"{prog}: {note}", flush=True)
    return cfg


def generators_main(argv: list[str] | None = None) -> int:
    parser = _common_parser(
        "sr1 generators", "Launch the generator pool (vLLM engines running the task's agent)."
    )
    parser.add_argument(
        "--num-engines", type=int, default=None, help="engines (default: generators.num_engines)"
    )
    parser.add_argument("--ray", action="store_true", help="Ray actors, one engine per GPU bundle")
    parser.add_argument(
        "--ray-address", default=None, help="Ray cluster address (default: RAY_ADDRESS or local)"
    )
    parser.add_argument(
        "--worker-prefix", default=None, help="worker ids are <prefix><i> (default: <host>-gen)"
    )
    args = parser.parse_intermixed_args(argv)
    cfg = _load(args, "sr1 generators", ("test",))  # the generators read the test prompts (evaluations)
    if cfg is None:
        return EXIT_BAD_INPUT
    logging.basicConfig(level=cfg.logging.level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    num_engines = args.num_engines or cfg.generators.num_engines
    prefix = args.worker_prefix or f"{socket.gethostname()}-gen"
    if args.ray or cfg.generators.use_ray:
        cfg = cfg.model_copy(update={"generators": cfg.generators.model_copy(update={"use_ray": True})})
        return run_generators_on_ray(cfg, num_engines, prefix, args.ray_address)
    sup = Supervisor()
    for child in generator_children(cfg, num_engines, prefix):
        log.info(
            "starting %s%s",
            child.name,
            f" on GPUs {child.env['CUDA_VISIBLE_DEVICES']}" if "CUDA_VISIBLE_DEVICES" in child.env else "",
        )
        sup.start(child)
    return _supervise(sup, on_failure="report", drain_s=cfg.generators.drain_timeout_s + 30)


def learner_main(argv: list[str] | None = None) -> int:
    parser = _common_parser(
        "sr1 learner", "Launch the learner pool (FSDP2 ranks, weight broadcast, checkpoints)."
    )
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint if any")
    args = parser.parse_intermixed_args(argv)
    cfg = _load(args, "sr1 learner", ("train",))
    if cfg is None:
        return EXIT_BAD_INPUT
    logging.basicConfig(level=cfg.logging.level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_dir = cfg.resolved_run_dir
    try:
        lock = RunLock(run_dir, "sr1 learner").acquire()  # one learner writes a run's checkpoints
    except RunLocked as err:
        print(f"sr1 learner: {err}", file=sys.stderr)
        return 2
    try:
        if not (run_dir / "config.yaml").exists():
            save_config(cfg, run_dir)
        if cfg.learner.use_ray:
            return run_learner_on_ray(cfg, args.resume)
        sup = Supervisor()
        for child in learner_children(cfg, args.resume):
            sup.start(child)
        return _supervise(sup, on_failure="stop_all", drain_s=600.0)
    finally:
        lock.release()


# -- the same pools as Ray actors (sr1/launch/ray.py places them) ------------------------------------------


def run_generators_on_ray(cfg: Config, num_engines: int, prefix: str, address: str | None = None) -> int:
    """One slot per engine; the pool's workers are watched as local ones are (a failed one is reported)."""
    sup = RaySupervisor(address)
    try:
        gpus = sup.cluster_gpus > 0
        need = num_engines * cfg.generators.engine.tensor_parallel_size
        if gpus and sup.cluster_gpus < need:
            raise SystemExit(
                f"{num_engines} engines need {need} GPUs; the Ray cluster has {sup.cluster_gpus:g}"
            )
        sup.reserve("generators", num_engines, generator_bundle(cfg, gpus))
        for child in generator_children(cfg, num_engines, prefix):
            started = sup.start(child)
            log.info("started %s on %s", started.name, started.slot.node)
        return _supervise(sup, on_failure="report", drain_s=cfg.generators.drain_timeout_s + 30)
    finally:
        sup.shutdown()


def run_learner_on_ray(cfg: Config, resume: bool, address: str | None = None) -> int:
    """One slot per rank, rank 0's node hosting torch.distributed's and weight sync's stores; one failed rank stops
    the others."""
    sup = RaySupervisor(address)
    try:
        cfg = place_learner(sup, cfg)
        for rank in learner_children(cfg, resume):
            rank.gang = "learner"
            sup.start(rank)
        return _supervise(sup, on_failure="stop_all", drain_s=600.0)
    finally:
        sup.shutdown()
