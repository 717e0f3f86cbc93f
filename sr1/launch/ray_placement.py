"""Sizing a run for Ray: which pool runs a part's command, one bundle of each pool, the GPUs the run needs.

    pool_of([sys.executable, "-m", "sr1.entrypoints.generators", ...])   # "generators" (or learner, retrieval, redis)
    generator_bundle(cfg, gpus=True)      # {"CPU": 1, "GPU": tensor_parallel_size}: one engine's share
    learner_bundle(gpus=True)             # {"CPU": 1, "GPU": 1}: one rank's share
    check_gpus(cfg, cluster_gpus=8.0)     # True: place by GPUs; too few GPUs is an error naming the numbers

With GPUs in the cluster a generator bundle holds `tensor_parallel_size` GPUs and a learner bundle one; without GPUs
every bundle holds one CPU (`num_cpus`), and placement follows the CPU counts the nodes were started with. Nothing
here talks to Ray: `RaySupervisor.reserve` (sr1/launch/ray.py) places the bundles.
"""

from __future__ import annotations

from pathlib import Path

from config import Config
from sr1 import entrypoints

POOL_OF_MODULE = {
    entrypoints.GENERATORS: "generators",
    entrypoints.LEARNER: "learner",
    entrypoints.RETRIEVAL: "retrieval",
}


def pool_of(cmd: list[str]) -> str:
    """The pool a part's command belongs to: generators, learner, retrieval or redis."""
    if len(cmd) > 2 and cmd[1] == "-m" and cmd[2] in POOL_OF_MODULE:
        return POOL_OF_MODULE[cmd[2]]
    if cmd and Path(cmd[0]).name == "redis-server":
        return "redis"
    raise ValueError(
        f"no Ray pool runs {' '.join(cmd[:3])!r}: expected -m {' | '.join(POOL_OF_MODULE)} or redis-server"
    )


def generator_bundle(cfg: Config, gpus: bool) -> dict[str, float]:
    """One engine's share of the cluster: `tensor_parallel_size` GPUs, or one CPU without GPUs."""
    tp = cfg.generators.engine.tensor_parallel_size
    return {"CPU": 1.0, "GPU": float(tp)} if gpus else {"CPU": 1.0}


def learner_bundle(gpus: bool) -> dict[str, float]:
    """One learner rank's share: one GPU, or one CPU without GPUs."""
    return {"CPU": 1.0, "GPU": 1.0} if gpus else {"CPU": 1.0}


def gpus_needed(cfg: Config) -> int:
    """GPUs the run asks for: generators.num_engines x tensor_parallel_size + learner.num_ranks."""
    return cfg.generators.num_engines * cfg.generators.engine.tensor_parallel_size + cfg.learner.num_ranks


def check_gpus(cfg: Config, cluster_gpus: float) -> bool:
    """Whether to place by GPUs (the cluster has some) or by CPUs (none); too few GPUs is an error."""
    need = gpus_needed(cfg)
    if cluster_gpus and cluster_gpus < need:
        raise ValueError(
            f"the Ray cluster has {cluster_gpus:g} GPUs; the run needs generators.num_engines "
            f"({cfg.generators.num_engines}) x generators.engine.tensor_parallel_size "
            f"({cfg.generators.engine.tensor_parallel_size}) + learner.num_ranks ({cfg.learner.num_ranks}) = {need}"
        )
    return cluster_gpus > 0
