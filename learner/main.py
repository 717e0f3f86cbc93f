"""The learner process (one rank): `python -m learner.main --config JOB_OR_PRESET [overrides] [--redis-url URL]`.

`--config` is the job file a launcher wrote (`<run_dir>/jobs/learner.yaml`: only the sections the learner uses) or a
preset / root config file, from which the learner takes its job (config/jobs.py). Rank, world size and the
rendezvous come from the torchrun-style environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) that
`sr1 learner` or torchrun set; without them it is a single rank. SIGTERM/SIGINT finish the current step, write a
checkpoint and exit 0. `--resume` continues from `<run_dir>/checkpoints/latest`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

log = logging.getLogger("learner")


def build_parser(prog: str = "python -m learner.main") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny", help="job file, preset name or YAML path (default: tiny)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. learner.lr=1e-6")
    parser.add_argument("--redis-url", default=None, help="Redis URL (default: buffer.redis_url)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint if any")
    parser.add_argument(
        "--device", default="auto", choices=["auto", "cpu", "cuda"], help="device (auto: CUDA when available)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)
    from config import LearnerJob, load_job, save_job

    overrides = list(args.overrides) + ([f"buffer.redis_url={args.redis_url}"] if args.redis_url else [])
    job = load_job(LearnerJob, args.config, overrides)
    if not job.buffer.redis_url:
        print("learner: no Redis URL: pass --redis-url or set buffer.redis_url", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=job.logging.level, format="%(asctime)s %(levelname)s [learner] %(name)s: %(message)s"
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from learner.distributed import init_distributed, shutdown_distributed
    from learner.loop import StopFlag, run_learner

    stop = StopFlag().install()
    world = init_distributed(args.device)
    if world.device.type == "cpu":
        # ranks on one machine share its cores; oversubscription makes gloo ranks crawl
        local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world.world_size)))
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        torch.set_num_threads(max(1, cores // max(1, local)))  # the cores it may run on (pinned pools: fewer)
    job_file = job.run_dir / "jobs" / "learner.yaml"
    if world.is_main and not job_file.exists():
        save_job(job, job_file)  # what this learner ran with (a launcher may have written it already)
    finished = False
    try:
        version = run_learner(job, world, resume=args.resume, stop=stop)
        if world.is_main:
            log.info("learner stopped at version %d", version)
        finished = True
    finally:
        shutdown_distributed(wait_for_peers=finished)
    return 0


if __name__ == "__main__":
    sys.exit(main())
