"""A generator worker process: `python -m generators.main --config JOB_OR_PRESET [overrides] [--redis-url URL]`.

`--config` is the job file a launcher wrote (`<run_dir>/jobs/generator-<i>.yaml`: only the sections a generator uses,
with its worker id and engine index) or a preset / root config file. The process loads the tokenizer, starts the vLLM
engine, builds the task (with its retrieval client) and runs one `GeneratorWorker` until SIGTERM/SIGINT, then drains
and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import Any

from generators.job import GeneratorJob

log = logging.getLogger("generators")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m generators.main", description=__doc__.splitlines()[0])
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
    from config.prompts import fitting_prompts

    if not job.data.test_files:
        return []
    prompts, overlong = fitting_prompts(job, "test", tokenizer)
    if overlong.count:
        log.warning("dropped %s (data.filter_overlong_prompts)", overlong.summary())
    return prompts


async def serve(job: GeneratorJob) -> int:
    """Start the engine and run the worker until a signal; the engine is shut down whatever happens."""
    from transformers import AutoTokenizer

    from buffer.redis_buffer import open_buffer
    from common.model_paths import resolve_model_path
    from generators.engine import DIE_WITH_PARENT_ENV, VLLMEngine
    from generators.worker import GeneratorWorker
    from tasks import build_task

    # a SIGTERM while the engine starts must still shut the engine down: remember it, stop right after
    stop_requested: list[bool] = []
    worker: GeneratorWorker | None = None

    def on_signal() -> None:
        stop_requested.append(True)
        if worker is not None:
            worker.request_stop()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)

    gen = job.generators
    model_path = str(resolve_model_path(job.model.path))  # a directory, or a hub id in the local HF cache
    tokenizer_path = (
        str(resolve_model_path(job.model.tokenizer_path, what="model.tokenizer_path"))
        if job.model.tokenizer_path
        else None
    )
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path or model_path)
    # read (and checked) before the engine starts: a bad test file stops the worker at once, not its evaluations
    test_prompts = evaluation_prompts(job, tokenizer)
    os.environ[DIE_WITH_PARENT_ENV] = "1"  # the engine's processes die with this one (a vLLM plugin reads it)
    max_model_len = gen.engine.max_model_len or job.model.max_seq_len
    buffer = open_buffer(job.buffer)
    log.info("worker %s: starting engine on %s", job.worker_id, model_path)
    engine = VLLMEngine.create(
        model_path,
        gen.engine,
        dtype=job.model.dtype,
        max_model_len=max_model_len,
        tokenizer_path=tokenizer_path,
        seed_offset=job.engine_index,
        version=0,
    )
    task = build_task(job.task, retrieval=job.retrieval)

    def eval_prompts() -> list:
        return test_prompts

    try:
        worker = GeneratorWorker(
            gen,
            buffer,
            engine,
            tokenizer,
            task,
            worker_id=job.worker_id,
            max_model_len=max_model_len,
            max_prompt_tokens=job.model.max_prompt_tokens,
            chat_template=job.model.chat_template,
            eval_prompts=eval_prompts if job.data.test_files else None,
            eval_max_turns=job.eval.max_turns,
            eval_seed=job.seed,
        )
        await asyncio.sleep(0)  # deliver a signal that arrived during the engine start
        if stop_requested:
            worker.request_stop()
        return await worker.run()
    finally:
        await task.close()
        engine.shutdown()
        buffer.close()


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    from buffer.memory import EvictingRedis
    from common.model_paths import ModelPathError
    from config import EXIT_BAD_INPUT, ConfigError, load_job
    from tasks import DataError

    overrides = list(args.overrides) + ([f"buffer.redis_url={args.redis_url}"] if args.redis_url else [])
    try:
        job = load_job(GeneratorJob, args.config, overrides)
    except ConfigError as err:
        print(f"generators: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    updates = {"worker_id": args.worker_id, "engine_index": args.engine_index}
    job = job.model_copy(update={k: v for k, v in updates.items() if v is not None})
    logging.basicConfig(level=job.logging.level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not job.buffer.redis_url:
        print("generators: no Redis URL (give --redis-url or buffer.redis_url=...)", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return asyncio.run(serve(job))
    except (
        DataError,
        ModelPathError,
        EvictingRedis,
    ) as err:  # found before the engine starts (serve reads its inputs first and opens the buffer)
        print(f"generators: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
