"""A generator worker process: load its job and test prompts, then run `generators.process.run_worker_process`.

    python -m sr1.entrypoints.generators --config JOB_OR_PRESET [--redis-url URL] [--worker-id ID] [overrides]

`--config` is the job file a launcher wrote (`<run_dir>/jobs/generator-<i>.yaml`: only the sections a generator uses,
with its worker id and engine index) or a preset / root config file. The process loads the tokenizer and the test
prompts (a bad job, model path or test file exits with `config.EXIT_BAD_INPUT` before any engine starts), then
starts the vLLM engine and runs one `GeneratorWorker` (`generators/process.py`) until SIGTERM/SIGINT, then drains and
exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from buffer.memory import EvictingRedis
from common.model_paths import ModelPathError, resolve_tokenizer_path
from generators.job import GeneratorJob
from generators.process import run_worker_process
from sr1.entrypoints import load_pool_job
from tasks import DataError

log = logging.getLogger("generators")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m sr1.entrypoints.generators", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--config", default="tiny", help="job file, preset name or YAML path (default: tiny)")
    parser.add_argument(
        "--redis-url", default=None, help="Redis URL of the buffer (default: buffer.redis_url)"
    )
    parser.add_argument(
        "--worker-id", default=None, help="consumer name in Redis (default: the job's, gen-0)"
    )
    parser.add_argument(
        "--engine-index", type=int, default=None, help="engine number in the pool (seed offset)"
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. generators.group_size=4")
    return parser.parse_intermixed_args(argv)


def evaluation_prompts(job: GeneratorJob, tokenizer: Any) -> list:
    """The test prompts the worker evaluates on, without those longer than model.max_prompt_tokens (counted and
    logged; an error instead with data.filter_overlong_prompts=false). DataError for a file that cannot be read."""
    from config.prompts import fitting_prompts  # torch, through config: not for --help

    if not job.data.test_files:
        return []
    prompts, overlong = fitting_prompts(job, "test", tokenizer)
    if overlong.count:
        log.warning("dropped %s (data.filter_overlong_prompts)", overlong.summary())
    return prompts


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    from config import EXIT_BAD_INPUT, ConfigError  # torch, through config: after --help

    try:
        job = load_pool_job(GeneratorJob, args.config, args.overrides, args.redis_url)
    except ConfigError as err:
        print(f"generators: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    updates = {"worker_id": args.worker_id, "engine_index": args.engine_index}
    job = job.model_copy(update={k: v for k, v in updates.items() if v is not None})
    logging.basicConfig(level=job.logging.level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from transformers import AutoTokenizer

    try:
        tokenizer_path = str(resolve_tokenizer_path(job.model))  # model.tokenizer_path, else the model's own
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        # read (and checked) before the engine starts: a bad test file stops the worker at once, not its evaluations
        test_prompts = evaluation_prompts(job, tokenizer) if job.data.test_files else None
        return asyncio.run(run_worker_process(job, tokenizer, tokenizer_path, test_prompts))
    except (DataError, ModelPathError, EvictingRedis) as err:
        # found before the engine starts (a bad model path too; the buffer is opened first)
        print(f"generators: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
