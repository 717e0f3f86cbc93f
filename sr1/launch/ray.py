"""The pools on a Ray cluster (`RAY_ADDRESS`, else a local Ray instance): the same processes, placed by Ray.

Generators: a placement group reserves one bundle of `tensor_parallel_size` GPUs per engine and each actor
supervises one `python -m generators.main` with its job file on its node. Learner: one actor per rank (one GPU each
when the cluster has them, CPU actors on gloo otherwise); rank 0's actor picks the torch.distributed address.
"""

from __future__ import annotations

import os
import signal

from config import Config
from config.loader import config_to_yaml


def run_generators_on_ray(cfg: Config, num_engines: int, prefix: str, address: str | None = None) -> int:
    """One Ray actor per engine inside a placement group (one bundle of GPUs per engine)."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.init(address=address or os.environ.get("RAY_ADDRESS"), ignore_reinit_error=True)
    tp = cfg.generators.engine.tensor_parallel_size
    per_gpu = tp if ray.cluster_resources().get("GPU", 0) else 0
    bundles = [{"CPU": 1, "GPU": per_gpu} if per_gpu else {"CPU": 1} for _ in range(num_engines)]
    pg = placement_group(bundles, strategy="PACK")
    ray.get(pg.ready(), timeout=600)

    @ray.remote(num_cpus=1)
    class GeneratorActor:
        """Supervises one `python -m generators.main` on its node (GPUs given by Ray)."""

        def __init__(self, job_yaml: str, name: str):
            import tempfile
            from pathlib import Path

            from sr1.launch.supervisor import Child, python_module

            path = Path(tempfile.mkdtemp(prefix="sr1-gen-")) / f"{name}.yaml"
            path.write_text(job_yaml)
            self.child = Child(name, python_module("generators.main", "--config", str(path))).start()

        def wait(self) -> int:
            return self.child.process.wait()

        def stop(self) -> None:
            self.child.send(signal.SIGTERM)

    actors = []
    for i in range(num_engines):
        name = f"{prefix}{i}"
        strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i)
        job_yaml = config_to_yaml(cfg.generator_job(name, i))
        actors.append(
            GeneratorActor.options(scheduling_strategy=strategy, num_gpus=per_gpu).remote(job_yaml, name)
        )

    def stop(signum, _frame) -> None:
        for actor in actors:
            actor.stop.remote()

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, stop)
    return max(ray.get([a.wait.remote() for a in actors]), default=0)


def run_learner_on_ray(cfg: Config, resume: bool) -> int:
    """One Ray actor per rank (one GPU each when the cluster has them); rank 0's node hosts the rendezvous."""
    import ray

    from sr1.launch.pools import rank_env

    num_ranks = cfg.learner.num_ranks
    ray.init(address=os.environ.get("RAY_ADDRESS") or None, ignore_reinit_error=True)
    gpus = 1 if ray.cluster_resources().get("GPU", 0) >= num_ranks else 0
    job_yaml = config_to_yaml(cfg.learner_job())

    @ray.remote(num_gpus=gpus)
    class LearnerRank:
        def address(self) -> tuple[str, int]:
            from sr1.launch.supervisor import free_port

            return ray.util.get_node_ip_address(), free_port()

        def run(self, env: dict, job_yaml: str, resume: bool) -> int:
            import tempfile
            from pathlib import Path

            os.environ.update(env)
            os.environ["LOCAL_RANK"] = "0"  # Ray exposes the actor's GPU as device 0
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from learner.main import main

            path = Path(tempfile.mkdtemp(prefix="sr1-learner-")) / "learner.yaml"
            path.write_text(job_yaml)
            return main(["--config", str(path), *(["--resume"] if resume else [])])

    actors = [LearnerRank.remote() for _ in range(num_ranks)]
    addr, port = ray.get(actors[0].address.remote())
    runs = [
        actor.run.remote(rank_env(rank, num_ranks, addr, port, 0, 1), job_yaml, resume)
        for rank, actor in enumerate(actors)
    ]
    try:
        return max(ray.get(runs))
    except KeyboardInterrupt:
        for actor in actors:
            ray.kill(actor)
        return 130
