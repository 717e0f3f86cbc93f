"""The learner process (one rank): load its job, then train with `learner.loop.run_learner`.

    python -m sr1.entrypoints.learner --config JOB_OR_PRESET [--redis-url URL] [--resume] [overrides]
    torchrun --nproc-per-node 8 -m sr1.entrypoints.learner --config qwen2.5-3b-8xh100 --redis-url URL

`--config` is the job file a launcher wrote (`<run_dir>/jobs/learner.yaml`: only the sections the learner uses) or a
preset / root config file, from which the learner takes its job (learner/job.py). Rank, world size and the
rendezvous come from the torchrun-style environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) that
`sr1 learner` or torchrun set; without them it is a single rank. SIGTERM/SIGINT finish the current step, write a
checkpoint and exit 0. `--resume` continues from the newest checkpoint under `<run_dir>/checkpoints` whose files
verify (learner/checkpoints/checkpointer.py). A configuration or data error (a bad job, an unreadable prompt file,
overlong prompts that may not be dropped), `learner.max_nonfinite_steps` skipped updates in a row, and checkpoints
none of which can be resumed from, exit with `config.EXIT_BAD_INPUT`; checkpoints that cannot be written (two in a row
failed: a full disk) with `config.EXIT_CHECKPOINT_FAILED`. Supervisors restart neither.

One learner per run: rank 0 holds the run directory's owner lock (sr1/launch/lock.py) while it lives, unless the
launcher that started it holds it (`sr1 run`, `sr1 learner`, `sr1 launch` name themselves in `LAUNCHER_ENV`). A
second learner on the same run directory (a second torchrun, or one beside `sr1 run`) stops at once, naming the
owner, with `config.EXIT_BAD_INPUT`: it would delete the first one's partial checkpoint and train its pending groups.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from common.launcher import LAUNCHER_ENV
from common.model_paths import ModelPathError, resolve_tokenizer_path
from learner.stop import StopFlag
from sr1.entrypoints import load_pool_job
from sr1.launch.lock import OWNER_LOCK, RunLock, RunLocked
from tasks import DataError

if TYPE_CHECKING:  # imported in main(): learner/'s settings import torch, and --help should answer at once
    from learner.job import LearnerJob

log = logging.getLogger("learner")


def take_run_lock(run_dir: Path) -> RunLock | None:
    """The run's owner lock for this learner, or None when the launcher named in `LAUNCHER_ENV` holds it. Raises
    RunLocked (naming the owner) when any other live process holds it."""
    try:
        return RunLock(run_dir, "learner").acquire()
    except RunLocked:
        launcher = os.environ.get(LAUNCHER_ENV)
        try:
            owner = json.loads((Path(run_dir) / OWNER_LOCK).read_text() or "{}")
        except (OSError, ValueError):
            owner = {}
        if launcher and launcher == f"{owner.get('host')}:{owner.get('pid')}":
            return None  # the launcher that started this learner owns the run
        raise


def build_parser(prog: str = "python -m sr1.entrypoints.learner") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny", help="job file, preset name or YAML path (default: tiny)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. learner.lr=1e-6")
    parser.add_argument("--redis-url", default=None, help="Redis URL (default: buffer.redis_url)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint if any")
    parser.add_argument(
        "--device", default="auto", choices=["auto", "cpu", "cuda"], help="device (auto: CUDA when available)"
    )
    return parser


def training_prompts(job: LearnerJob) -> list:
    """The task's training prompts without those longer than model.max_prompt_tokens (counted and logged; an error
    instead with data.filter_overlong_prompts=false). DataError for a file that cannot be read."""
    from transformers import AutoTokenizer

    from config.prompts import NO_TRAIN_FILES, fitting_prompts  # torch, through config: not for --help

    if not job.data.train_files:
        raise DataError(NO_TRAIN_FILES)
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_tokenizer_path(job.model)))
    prompts, overlong = fitting_prompts(job, "train", tokenizer)
    if overlong.count:
        log.warning("dropped %s (data.filter_overlong_prompts)", overlong.summary())
    return prompts


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)
    # config/ and learner/ import torch: after --help has answered
    from config import EXIT_BAD_INPUT, EXIT_CHECKPOINT_FAILED, ConfigError, save_job
    from learner.job import LearnerJob

    try:
        job = load_pool_job(LearnerJob, args.config, args.overrides, args.redis_url)
    except ConfigError as err:
        print(f"learner: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    logging.basicConfig(
        level=job.logging.level, format="%(asctime)s %(levelname)s [learner] %(name)s: %(message)s"
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    prompts = None
    rank0 = int(os.environ.get("RANK", "0")) == 0
    lock = None
    if rank0:  # rank 0 owns the run and feeds the prompts; a second learner or a bad file stops before any collective
        try:
            lock = take_run_lock(job.run_dir)
        except RunLocked as err:
            print(f"learner: {err}", file=sys.stderr)
            return EXIT_BAD_INPUT
        try:
            prompts = training_prompts(job)
        except (DataError, ModelPathError) as err:
            print(f"learner: {err}", file=sys.stderr)
            return EXIT_BAD_INPUT
    # torch and the training loop: only once the job is valid and the prompts are read
    import torch

    from buffer.memory import EvictingRedis
    from learner.checkpoints.checkpointer import CheckpointLoadError
    from learner.checkpoints.safety_net import CheckpointsFailing
    from learner.distributed import init_distributed, shutdown_distributed
    from learner.loop import run_learner
    from learner.steps import NonFiniteTrainingError

    stop = StopFlag().install()
    world = init_distributed(args.device, timeout_s=job.learner.collective_timeout_s)
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
        version = run_learner(job, world, resume=args.resume, stop=stop, prompts=prompts)
        if world.is_main:
            log.info("learner stopped at version %d", version)
        finished = True
    except (NonFiniteTrainingError, CheckpointLoadError, EvictingRedis) as err:
        # a restart would resume from the last checkpoint into the same updates, fail on the same files or open the
        # same Redis: stop
        print(f"learner: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except CheckpointsFailing as err:
        # a restart would train without a safety net again until the disk has room: stop, say what it needs
        print(f"learner: {err}", file=sys.stderr)
        return EXIT_CHECKPOINT_FAILED
    finally:
        shutdown_distributed(wait_for_peers=finished)
        if lock is not None:
            lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
